"""The parse side of a tar upload, run in worker threads, never on the event loop.

The event loop only receives the body and counts it against the size limit;
it hands batches of about a MiB to :meth:`TarSink.feed_many` in a worker,
which hashes them, runs them through the sans-IO :class:`TarParser` and
applies each entry through the :class:`TarExtractor`. The parser keeps no
more than one metadata block, so memory is bounded by the batches in flight
whatever the upload's size, and its work is linear in the bytes fed.

Parsing headers is pure Python and holds the GIL: a flood of tiny entries (a MiB
batch is 2,048 headers, tens of ms) would make the event loop, back from every
socket call, wait a whole switch interval (5 ms) for the GIL each time, so every
other copy on the node slows by that much per step. The sink hands the GIL over
every :data:`ENTRIES_PER_YIELD` entries, so the loop waits for one slice at most.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from aggapi.agent.copy.atomic import SETID, WRITEBACK_STEP, AtomicFile
from aggapi.agent.copy.fastuntar import FastUntar
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.tarextract import TarExtractor, entry_parts
from aggapi.status import StatusError
from aggapi.tar.entrydigest import EntryDigests, HeadersHash
from aggapi.tar.parse import (
    CONT,
    DIR,
    ENTRY_END,
    LNK,
    REG,
    SYM,
    TarEntry,
    TarError,
    TarLimits,
    TarParser,
)

# Entries parsed between two hand-overs of the GIL: 32 headers are under half a ms
# of parsing, a tenth of the interpreter's switch interval.
ENTRIES_PER_YIELD = 32


def yield_gil() -> None:
    """Let a thread waiting for the GIL (the event loop) run now: a zero sleep
    releases the GIL, and CPython gives it to a waiter before taking it back."""
    time.sleep(0)


class TarSink:
    """Parses pushed body batches and extracts their entries (blocking; one worker at a
    time). Refusals are StatusError (400, or 413 for a limit) or TarError (400)."""

    def __init__(self, ex: TarExtractor, root: FsRoot, limits: CopyLimits,
                 tar_limits: TarLimits | None = None,
                 pause: Callable[[], None] = yield_gil, *,
                 headers_only: bool = False, fast: bool = True) -> None:
        self.ex = ex
        self.pause = pause
        ex.max_ops = limits.max_entries  # --copy-max-entries bounds the metadata work too
        self.root = root
        self.limits = limits
        self.parser = TarParser(tar_limits or TarLimits())
        # The whole stream's sha256, or with headers_only its headers digest (a file's
        # data is hashed once, for its own record: aggapi.tar.entrydigest).
        self.headers = HeadersHash() if headers_only else None
        self.hash: Any = self.headers if self.headers is not None else hashlib.sha256()
        self.size = 0
        self.entries = 0  # every entry, "./" included
        self.af: AtomicFile | None = None
        self.entry: TarEntry | None = None
        self.rel = ""
        self.digests = EntryDigests()  # each file's AGGAPI.sha256, checked before commit
        self.want: str | None = None  # the current file's
        self.pieces: list[bytes] = []
        self.entries_per_yield = ENTRIES_PER_YIELD
        # The compiled loop, where built (fastuntar; fast=False: the reference alone).
        self.fast = FastUntar.make(self) if fast else None

    def feed_many(self, batch: list[bytes]) -> None:
        headers = self.headers
        fast = self.fast
        big = self.entry is not None and self.entry.size >= WRITEBACK_STEP
        if fast is not None and len(batch) > 1 and not big:
            # Entries cut between received pieces go the Python way: one piece per batch
            # (a copy of about a MiB) lets the compiled loop take nearly all of them. A
            # big file's data is left as it comes.
            batch = [b"".join(batch)]
        for data in batch:
            if headers is None:
                self.hash.update(data)
            else:
                headers.piece(data)
            self.size += len(data)
            if fast is None:
                self._events(data, 0, stop=False)
            else:  # the compiled loop, then one entry in Python, alternately
                pos, end, parser = 0, len(data), self.parser
                while (pos := parser.skip_pad(pos, end)) < end:
                    if parser.at_boundary():
                        pos = fast.run(data, pos)
                        if pos >= end:
                            break
                    pos = self._events(data, pos, stop=True)
            if headers is not None:
                headers.done()
        self._flush()

    def _events(self, data: bytes, pos: int, stop: bool) -> int:
        """Apply the events of ``data[pos:]``, to the end of the piece or, with
        ``stop``, to the end of the next entry; where it stopped."""
        headers = self.headers
        parser = self.parser
        for ev in parser.feed(data, pos):
            if isinstance(ev, bytes):
                if self.af is not None:
                    self.pieces.append(ev)
                    if headers is not None and self.want is not None:
                        headers.skip(parser.data_at, len(ev))
            elif isinstance(ev, TarEntry):
                if self.entries % self.entries_per_yield == 0:
                    # A container that exited stops the copy within a slice of
                    # entries (a poll per entry cost as much as its parse).
                    self.root.ensure_alive()
                self._begin(ev)
                if self.entries % self.entries_per_yield == 0:
                    self.pause()
            elif ev is ENTRY_END:
                self._end()
                if stop:
                    return parser.pos
        return len(data)

    def finish(self) -> None:
        """After the last batch: the stream must have held a whole archive."""
        self.parser.close()

    def abort(self) -> None:
        """Close a file left open by a refusal (the extractor's rollback unlinks it)."""
        af, self.af, self.pieces = self.af, None, []
        if af is not None:
            af.close()
            os.close(af.dir_fd)

    def _flush(self) -> None:
        if self.af is not None and self.pieces:
            self.af.write_many(self.pieces)
        self.pieces = []

    def _begin(self, entry: TarEntry) -> None:
        lim = self.limits
        self.entries += 1
        if self.entries > lim.max_entries:
            raise StatusError(413, f"tar has more than {lim.max_entries} entries")
        self.ex.charge()
        want = self.digests.expected(entry)
        parts = entry_parts(entry.name)
        if not parts:
            return  # "./": the target itself (its data, if any, is dropped)
        if len(parts) > lim.max_depth:
            raise StatusError(413, f"tar entry {entry.name!r} is deeper than "
                              f"{lim.max_depth} levels")
        if entry.size > lim.size_limit:
            raise StatusError(413, f"tar entry {entry.name!r} of {entry.size} bytes exceeds "
                              f"the size limit of {lim.size_limit} bytes")
        rel = "/".join(parts)
        t = entry.typeflag
        if t == DIR:
            self.ex.mkdir(rel, entry.mode & ~SETID)
        elif t in (REG, CONT):
            self.af, self.entry, self.rel = self.ex.begin_file(rel), entry, rel
            self.want = want
        elif t == SYM:
            self.ex.symlink(rel, entry.linkname)
        elif t == LNK:
            self.ex.hardlink(rel, entry.linkname)
        else:
            raise StatusError(400, f"tar entry {entry.name!r} has type "
                              f"{t.decode('latin-1')!r}: device nodes, FIFOs and other special "
                              "files are refused")

    def _end(self) -> None:
        if self.af is None or self.entry is None:
            return
        self._flush()
        af, e, self.af, self.entry = self.af, self.entry, None, None
        self.ex.end_file(af, self.rel, e.size, e.mode, e.mtime_ns, sha256=self.want)


__all__ = ["TarError", "TarSink", "entry_parts"]
