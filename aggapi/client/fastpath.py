"""The compiled per-file loop of a directory download, where it is built (issue 35, item 6).

A tree of small files spends most of the client's CPU in the interpreter between the
few syscalls each file takes (header parsing, digest bookkeeping, dispatch). The C
module ``aggapi.client._fastextract`` runs that loop for the common entry, a plain
regular file in the directory the previous entry went into, and hands every other
entry, and any entry with something wrong, to :class:`aggapi.client.extractor.Extractor`
(the reference, see the C file's header for exactly what it takes). Nothing here is
needed: without the module (a kubectl plugin archive is pure Python, a machine without
a C compiler), or with ``AGGAPI_PURE_PYTHON=1`` in the environment, every entry goes
the Python way, with the same result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from aggapi import native
from aggapi.client.errors import IntegrityError
from aggapi.tar.entrydigest import ALGORITHM, ANNOUNCE_RECORD, TRAILING

_native = native.optional("aggapi.client._fastextract")


def loaded() -> bool:
    """The compiled loop is there and not switched off."""
    return native.enabled(_native)


class FastPath:
    """Runs the compiled loop for one extractor where its state allows."""

    # ``ex``: the aggapi.client.extractor.Extractor it serves (Any: that module imports
    # this one, and the layer test refuses import loops, typing-only ones too).
    def __init__(self, ex: Any, run: Callable[..., Any]) -> None:
        self.ex = ex
        self.run_native = run
        self._prefix: tuple[tuple[str, ...], bytes] = ((), b"")

    @classmethod
    def make(cls, ex: Any) -> FastPath | None:
        if not loaded() or ex.sync_each:  # (an fsync per file: the Python path's)
            return None
        assert _native is not None
        return cls(ex, _native.run)

    def _ready(self) -> bool:
        """The state is one the compiled loop handles as the Python path would: a
        parent directory open, no file open, the digests decided, and no global record
        but the digests' announcement (which entries would otherwise inherit)."""
        ex, dg = self.ex, self.ex.digests
        if ex._last is None or ex._out is not None or dg.required is None:
            return False
        glob = ex.parser._global
        if len(glob) > 1 or (glob and ANNOUNCE_RECORD not in glob):
            return False
        ann = glob.get(ANNOUNCE_RECORD)
        if ann is None:
            return not dg.required
        return bool(dg.required) and ann in (ALGORITHM, TRAILING)

    def run(self, data: bytes | memoryview, pos: int) -> tuple[int, int, bool]:
        """Apply the entries from ``pos`` the compiled loop takes: where it stopped,
        the data bytes written, and whether it stopped at an entry the piece cuts."""
        if not self._ready():
            return pos, 0, False
        ex, dg = self.ex, self.ex.digests
        assert ex._last is not None
        key, pfd = ex._last
        if self._prefix[0] != key:
            self._prefix = (key, b"".join(
                p.encode("utf-8", "surrogateescape") + b"/" for p in key))
        lim = ex.parser.limits
        if lim.max_meta_run < 1:
            return pos, 0, False
        pos, entries, nbytes, after, written, mismatch, short = self.run_native(
            data, pos, self._prefix[1], pfd, key, ex.umask, dg.trailing, bool(dg.required),
            dg.after, ex.written, ex.files, hashlib.sha256, lim.max_meta,
            lim.max_pax_records)
        ex.result.entries += entries
        dg.after, ex.written = after, written
        if mismatch is not None:
            name, got, want = mismatch
            raise IntegrityError.from_message(
                f"sha256 mismatch for {name!r}: got {got}, the server sent {want}; "
                "nothing was placed")
        return pos, nbytes, bool(short)
