"""The compiled per-file loop of a tar upload, where it is built (issue 35, item 6).

A tree of small files spends most of the agent's upload CPU in the interpreter between
the few syscalls each file takes (header parsing, limits, digest checks, dispatch).
The C module ``aggapi.agent.copy._fastuntar`` runs that loop for the common entry: a
plain regular file in the directory the previous file went into, in an upload that
builds a new target in its private tree (tarextract's ``fresh``). Every other entry,
and any entry with something wrong, goes to :class:`aggapi.agent.copy.untar.TarSink`
(the reference; the C file's header says exactly what the loop takes). Paths are never
resolved there: the directory was opened and confined by the Python path (openat2
under the target), and the loop creates one checked name in it with O_EXCL|O_NOFOLLOW.

Nothing here is needed: without the module (an image built without a compiler, a
checkout without ``setup.py build_ext``), or with ``AGGAPI_PURE_PYTHON=1`` in the
agent's environment, every entry goes the Python way, with the same result.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from aggapi import native
from aggapi.agent.copy import fastwalk
from aggapi.agent.copy.atomic import WRITEBACK_STEP, sha256_mismatch
from aggapi.fs import syncfs
from aggapi.tar import stream
from aggapi.tar.entrydigest import ALGORITHM, ANNOUNCE_RECORD

_native = native.optional("aggapi.agent.copy._fastuntar")
ENV = native.ENV


def loaded() -> bool:
    """The compiled loop is there and not switched off."""
    return native.enabled(_native)


def describe() -> str:
    """Which paths this agent's tar copies take, for its start-up log line: the upload
    loop here, the download walk's (aggapi.agent.copy.fastwalk), and the tar writer's
    header builders (aggapi.tar.stream, downloads)."""
    def which(mod: ModuleType | None, name: str) -> str:
        if native.switched_off():
            return f"python ({ENV} is set)"
        return f"compiled ({name})" if mod is not None else f"python ({name} is not built)"

    return (f"tar uploads: {which(_native, 'aggapi.agent.copy._fastuntar')}; "
            f"tar walks: {which(fastwalk._native, 'aggapi.agent.copy._fastwalk')}; "
            f"tar headers: {which(stream._native, 'aggapi.tar._fastheader')}")


class FastUntar:
    """Runs the compiled loop for one :class:`~aggapi.agent.copy.untar.TarSink`."""

    # ``sink``: the TarSink it serves (Any: that module imports this one, and the layer
    # test refuses import loops, typing-only ones too).
    def __init__(self, sink: Any, run: Callable[..., Any]) -> None:
        self.sink = sink
        self.run_native = run
        self._ids: tuple[int, int] | None = None
        self.taken = 0  # entries the compiled loop applied (tests, benchmarks)
        self._prefix: tuple[str, bytes] = ("", b"")

    @classmethod
    def make(cls, sink: Any) -> FastUntar | None:
        # A private tree (no temp names, nothing to replace) whose small files are made
        # durable by syncfs: the Python path's simplest case, the only one taken.
        if not loaded() or sink.ex.fresh is None or not syncfs.available():
            return None
        assert _native is not None
        return cls(sink, _native.run)

    def _ready(self) -> bool:
        """The state is one the compiled loop handles as the Python path would: a
        parent directory open, no file open, the digests decided, no global record but
        the digests' announcement, and not an entry that checks the container first."""
        sink, ex, dg = self.sink, self.sink.ex, self.sink.digests
        if ex._parent is None or sink.af is not None or dg.required is None:
            return False
        if sink.entries % sink.entries_per_yield == 0:
            return False  # TarSink polls the container before this one: its entry
        glob = sink.parser._global
        if len(glob) > 1 or (glob and ANNOUNCE_RECORD not in glob):
            return False
        ann = glob.get(ANNOUNCE_RECORD)
        return not dg.required if ann is None else (dg.required and ann == ALGORITHM)

    def run(self, data: bytes, pos: int) -> int:
        """Apply the entries from ``pos`` the compiled loop takes; where it stopped."""
        if not self._ready():
            return pos
        sink, ex = self.sink, self.sink.ex
        lim, tl = sink.limits, sink.parser.limits
        parent, pfd = ex._parent
        depth = parent.count("/") + 2 if parent else 1
        if depth > lim.max_depth or tl.max_meta_run < 1:
            return pos
        if self._ids is None:
            try:
                self._ids = ex._ids(None, None)
            except Exception:  # an unmapped owner: the Python path's error, at its entry
                return pos
        if self._prefix[0] != parent:
            self._prefix = (parent, (parent + "/").encode("utf-8", "surrogateescape")
                            if parent else b"")
        per = sink.entries_per_yield
        take = min(per - sink.entries % per, lim.max_entries - sink.entries,
                   (ex.max_ops if ex.max_ops is not None else 1 << 62) - ex.ops)
        if take <= 0:
            return pos
        skip = sink.headers.skip if sink.headers is not None else None
        pos, taken, mismatch, err = self.run_native(
            data, pos, self._prefix[1], pfd, parent, bool(sink.digests.required), skip,
            take, lim.size_limit, WRITEBACK_STEP, tl.max_meta, tl.max_pax_records,
            *self._ids, ex.pending, ex.pending_type, ex.files, ex.sync_fds,
            hashlib.sha256)
        sink.entries += taken
        ex.ops += taken
        self.taken += taken
        if mismatch is not None:
            rel, got, want = mismatch
            raise sha256_mismatch(ex.full(rel), got, want)
        if err:
            raise OSError(err, os.strerror(err))
        if taken and sink.entries % per == 0:
            sink.pause()
        return pos
