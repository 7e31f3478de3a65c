"""The compiled per-file loop of a directory download's walk, where it is built (issue 35).

A tree of small files spent most of the agent's download CPU in the interpreter around
the few syscalls each file takes. The C module ``aggapi.agent.copy._fastwalk`` runs that
loop for the common entry of a digest=trailer walk (ncp's): a plain regular file of at
most a chunk, with one link, on the walked directory's file system (its C file's header
says exactly what it takes). Each is opened by one name under the walked directory's fd
with O_NOFOLLOW and re-opened through /proc/self/fd, as the Python path does; every
other entry, and any entry whose call fails, goes to
:class:`aggapi.agent.copy.tarwalk.TarWalker` (the reference), before anything of it is
counted or sent.

Nothing here is needed: without the module, or with ``AGGAPI_PURE_PYTHON=1`` in the
agent's environment, every entry goes the Python way, with byte-identical tar.
"""

from __future__ import annotations

import hashlib
from typing import Any

from aggapi import native

_native = native.optional("aggapi.agent.copy._fastwalk")

# A call returns after the piece it builds reaches this: the walk's steps stay about a
# chunk each (a client that leaves frees its worker within one).
BUDGET = 1 << 20


def loaded() -> bool:
    """The compiled loop is there and not switched off."""
    return native.enabled(_native)


def files(walker: Any, dfd: int, dev: int, names: list[str], start: int, prefix: str
          ) -> tuple[int, bytes]:
    """The entries of ``names[start:]`` the compiled loop takes, as ``walker``'s
    (a TarWalker's) tar piece, its counts and owed digest updated; and the index of the
    first entry it left to the Python walk."""
    assert _native is not None
    nxt, piece, walker.entries, walker.size, walker.owed = _native.files(
        dfd, dev, names, start, prefix, walker.owed, walker.entries, walker.size,
        walker.limits.max_entries, walker.limits.size_limit, walker.root.uid_map.ranges,
        walker.root.gid_map.ranges, BUDGET, hashlib.sha256)
    return nxt, piece
