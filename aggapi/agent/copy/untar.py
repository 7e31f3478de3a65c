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

from aggapi.agent.copy.atomic import SETID, AtomicFile
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
                 headers_only: bool = False) -> None:
        self.ex = ex
        self.pause = pause
        ex.max_ops = limits.max_entries  # --copy-max-entries bounds the metadata work too
        self.root = root
        self.limits = limits
        self.parser = TarParser(tar_limits or TarLimits())
        # The whole stream's sha256, or with headers_only its headers digest (a file's
        # data is hashed once, for its own record: aggapi.tar.entrydigest).
        self.hash: Any = HeadersHash() if headers_only else hashlib.sha256()
        self.size = 0
        self.entries = 0  # every entry, "./" included
        self.af: AtomicFile | None = None
        self.entry: TarEntry | None = None
        self.rel = ""
        self.digests = EntryDigests()  # each file's AGGAPI.sha256, checked before commit
        self.want: str | None = None  # the current file's
        self.pieces: list[bytes] = []

    def feed_many(self, batch: list[bytes]) -> None:
        headers = self.hash if isinstance(self.hash, HeadersHash) else None
        for data in batch:
            if headers is None:
                self.hash.update(data)
            else:
                headers.piece(data)
            self.size += len(data)
            for ev in self.parser.feed(data):
                if isinstance(ev, bytes):
                    if self.af is not None:
                        self.pieces.append(ev)
                        if headers is not None and self.want is not None:
                            headers.skip(self.parser.data_at, len(ev))
                elif isinstance(ev, TarEntry):
                    if self.entries % ENTRIES_PER_YIELD == 0:
                        # A container that exited stops the copy within a slice of
                        # entries (a poll per entry cost as much as its parse).
                        self.root.ensure_alive()
                    self._begin(ev)
                    if self.entries % ENTRIES_PER_YIELD == 0:
                        self.pause()
                elif ev is ENTRY_END:
                    self._end()
            if headers is not None:
                headers.done()
        self._flush()

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
