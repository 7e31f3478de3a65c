"""Each regular file's sha256 in its own tar entry: directory copies verified file by file.

A directory travels as one PAX tar both ways (ncp's upload, the agent's download).
Every regular file's entry carries the PAX record ``AGGAPI.sha256`` (64 lowercase hex
digits of the file's data), and the receiver checks it before the file is placed:
the agent before its temp file is renamed into place, the ncp client before its
private temp tree is renamed into place. A mismatch fails the whole copy, naming the
file, and nothing is placed. Vendor records are ignored by ordinary tar programs
(GNU tar warns about the unknown keyword; bsdtar, busybox and Python's tarfile say
nothing), so the stream stays a plain tar for anyone else who reads it.

Both peers are aggapi's own, so an entry without its record is refused, but only in a
stream that says every entry has one: the writer puts the global record
``AGGAPI.entryDigests=sha256`` before the first entry. That announcement travels in
the tar itself, so no proxy or relay can drop it; a new writer always sends it, so a
new pair never skips the check. A stream without it comes from an older peer during an
upgrade (an older ncp uploading to a new agent, or a new ncp downloading from an older
agent): its files carry no records and are accepted unchecked, as before, while any
record present is still checked. The record of a file is its entry's own (an ``x``
header): in a global header, or twice for one entry, the parser refuses it.

Digests may trail their files instead (a download asked with ``digest=trailer``, so the
agent reads each file once, hashing as it sends): the announcement is then
``AGGAPI.entryDigests=sha256-next``, a regular file's entry carries no record, and the
entry right after it (the next entry, or the closing "./" one that every such stream
ends with) carries ``AGGAPI.previousSha256``, in its own ``x`` header on the same terms.
The reader hashes a file as it writes it and checks the digest when the next entry's
header arrives, before anything is placed; memory stays one header's. An older reader
refuses the announcement as an unknown algorithm, but never asks for it.
"""

from __future__ import annotations

import hashlib
import re

from aggapi.tar.parse import CONT, PREVIOUS_SHA256_RECORD, REG, SHA256_RECORD, TarEntry, TarError
from aggapi.tar.stream import GPAX, pax_header

ANNOUNCE_RECORD = "AGGAPI.entryDigests"
ALGORITHM = "sha256"
# The global header every new writer starts its tar with.
ANNOUNCEMENT = pax_header("pax_global_header", {ANNOUNCE_RECORD: ALGORITHM}, typeflag=GPAX)
TRAILING = ALGORITHM + "-next"  # each file's digest on the entry after it
TRAILING_ANNOUNCEMENT = pax_header("pax_global_header", {ANNOUNCE_RECORD: TRAILING},
                                   typeflag=GPAX)
# A placeholder of the record's length: a header's size depends only on it.
PLACEHOLDER = {SHA256_RECORD: "0" * 64}

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DATA = (REG, CONT)


def record(digest: str) -> dict[str, str]:
    """The PAX records that carry ``digest`` (hex) in a regular file's entry."""
    return {SHA256_RECORD: digest}


def previous(digest: str | None) -> dict[str, str]:
    """The PAX records of the entry after a regular file whose digest trails it."""
    return {} if digest is None else {PREVIOUS_SHA256_RECORD: digest}


class EntryDigests:
    """One stream's check of its entries' records, fed every entry in order.

    :meth:`expected` returns the sha256 a regular file's data must have (None when an
    unannounced stream's entry has no record), or raises :class:`TarError`."""

    def __init__(self, *, trailing_ok: bool = False) -> None:
        self.required: bool | None = None  # decided by the first entry
        self.trailing_ok = trailing_ok  # this reader asked for digests after their files
        self.trailing = False  # the stream announced them so
        self.after: str | None = None  # the regular file whose digest the next entry has

    def expected(self, entry: TarEntry) -> str | None:
        announced = entry.pax.get(ANNOUNCE_RECORD)
        known = (ALGORITHM, TRAILING) if self.trailing_ok else (ALGORITHM,)
        if announced is not None and announced not in known:
            raise TarError(f"unsupported {ANNOUNCE_RECORD} {announced[:40]!r} (this side "
                           f"checks {' or '.join(known)})")
        if self.required is None:
            self.required = announced is not None
            self.trailing = announced == TRAILING
        elif announced is not None and not self.required:
            raise TarError(f"{ANNOUNCE_RECORD} came after the first entry; it must precede "
                           "every entry")
        digest = entry.pax.get(SHA256_RECORD)
        if entry.typeflag not in _DATA or self.trailing:
            if digest is not None and self.trailing:
                raise TarError(f"tar entry {entry.name!r} carries a {SHA256_RECORD} record "
                               "in a stream whose digests trail their files")
            if digest is not None:
                raise TarError(f"tar entry {entry.name!r} is not a regular file but carries "
                               f"a {SHA256_RECORD} record")
            return None
        if digest is None:
            if self.required:
                raise TarError(f"tar entry {entry.name!r} carries no {SHA256_RECORD} record "
                               "(the stream announced one for every regular file)")
            return None
        return _valid(entry, SHA256_RECORD, digest)

    def trailed(self, entry: TarEntry) -> str | None:
        """The sha256 the regular file before ``entry`` must have, from ``entry``'s record
        (None: none is owed); call after :meth:`expected`, for every entry in order."""
        digest = entry.pax.get(PREVIOUS_SHA256_RECORD)
        after, self.after = self.after, None
        if self.trailing and entry.typeflag in _DATA:
            self.after = entry.name
        if after is None:
            if digest is not None:
                raise TarError(f"tar entry {entry.name!r} carries a {PREVIOUS_SHA256_RECORD} "
                               "record but follows no regular file of a stream whose "
                               "digests trail")
            return None
        if digest is None:
            raise TarError(f"the sha256 of {after!r} did not follow it (tar entry "
                           f"{entry.name!r} carries no {PREVIOUS_SHA256_RECORD} record)")
        return _valid(entry, PREVIOUS_SHA256_RECORD, digest)

    def owed(self) -> str | None:
        """At the end of the stream: the regular file whose digest never came."""
        return self.after


def _valid(entry: TarEntry, name: str, digest: str) -> str:
    if _HEX64.fullmatch(digest) is None:
        raise TarError(f"tar entry {entry.name!r} has a malformed {name} record "
                       f"{digest[:80]!r} (64 lowercase hex digits expected)")
    return digest


class HeadersHash:
    """The headers digest of a stream, fed each piece (:meth:`piece`), the data events
    it leaves out (:meth:`skip`, with :attr:`TarParser.data_at
    <aggapi.tar.parse.TarParser.data_at>`), then :meth:`done` for the rest of the piece."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._view = memoryview(b"")
        self._mark = 0

    def piece(self, data: bytes) -> None:
        self._view, self._mark = memoryview(data), 0

    def skip(self, at: int, n: int) -> None:
        """Leave out ``n`` bytes at ``at`` in the piece: a checked file's data."""
        if at > self._mark:
            self._hash.update(self._view[self._mark:at])
        self._mark = at + n

    def done(self) -> None:
        if self._mark < len(self._view):
            self._hash.update(self._view[self._mark:])
        self._view, self._mark = memoryview(b""), 0

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
