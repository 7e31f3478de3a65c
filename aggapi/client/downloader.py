"""Downloads: stat, a file (verified against its sha256, resumed with ``Range``/``If-Range``
after a cut connection and across runs through the partial file kept beside the
destination), a directory (a PAX tar, extracted by :mod:`aggapi.client.extract`) or a
symlink (cp -P).

They ask for the digest after the data (``digest=trailer``: the agent reads the file
once); an agent that predates it sends ``X-Aggapi-Sha256`` up front.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

import aiohttp

from aggapi import wire
from aggapi.client.confine import link_stays_inside
from aggapi.client.connection import Connection
from aggapi.client.errors import (
    AggapiError,
    IntegrityError,
    RangeNotSatisfiable,
    TransferError,
    UnsafeArchive,
)
from aggapi.client.extract import extract_dir
from aggapi.client.partial import Origin, PartialFile
from aggapi.client.remote import NoProgress, Progress, RateLimit, RemotePath, Result
from aggapi.client.retry import CATCH, Backoff, wait_or_raise
from aggapi.fs.pump import pump
from aggapi.serve.bodyreceiver import ResponseBody
from aggapi.tar.stream import TarReader


def decode_stat(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        doc = json.loads(base64.b64decode(value))
    except (ValueError, binascii.Error):
        return {}
    return doc if isinstance(doc, dict) else {}


def response_sha256(headers: Any) -> str | None:
    """The whole file's sha256 (hex) from X-Aggapi-Sha256, Repr-Digest or Digest."""
    sha = headers.get(wire.HEADER_SHA256)
    if sha and re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        return str(sha).lower()
    for name, pat in ((wire.HEADER_REPR_DIGEST, r"sha-256=:([^:]+):"),
                      (wire.HEADER_DIGEST, r"sha-256=([^,\s]+)")):
        m = re.search(pat, headers.get(name, ""))
        if m:
            with contextlib.suppress(ValueError, binascii.Error):
                raw = base64.b64decode(m.group(1), validate=True)
                if len(raw) == 32:
                    return raw.hex()
    return None


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", (value or "").strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


# A stat is of the path itself (a symlink as the link), and asks for no digest up front:
# HEAD answers as GET would, so without these it would refuse a symlink and hash a file.
STAT_CHOICES = {wire.PARAM_SYMLINK: wire.SYMLINK_KEEP, wire.PARAM_DIGEST: wire.DIGEST_TRAILER}


async def stat_remote(conn: Connection, rp: RemotePath) -> dict[str, Any]:
    """The X-Aggapi-Stat object of the path (NotFound if it does not exist)."""
    try:
        async with conn.request("HEAD", rp.url(), params=rp.params(**STAT_CHOICES)) as resp:
            return decode_stat(resp.headers.get(wire.HEADER_STAT))
    except AggapiError as exc:
        if not exc.bodiless:
            raise
    # A HEAD reply carries no Status: ask with GET for the server's message (on the
    # unlikely success the body is dropped unread, the headers are the same).
    async with conn.request("GET", rp.url(), params=rp.params(**STAT_CHOICES)) as resp:
        return decode_stat(resp.headers.get(wire.HEADER_STAT))


async def download(conn: Connection, rp: RemotePath, dest: Path, *,
                   progress: Progress | None = None, backoff: Backoff | None = None,
                   rate_limit: float | None = None, preserve: bool = True,
                   keep_symlink: bool = False) -> Result:
    """Copy ``rp`` to the local ``dest`` (a file, a directory tree or a symlink);
    ``preserve=False``: a file keeps the local default mode, not the container's.
    ``keep_symlink`` (cp -P): a path that is a symlink becomes a local symlink;
    otherwise it is refused, as a link is not the file (the server refuses it too)."""
    progress = progress or NoProgress()
    backoff = backoff or Backoff()
    partial = PartialFile(dest)
    origin = partial.resumable(rp.source())
    resumed_from = partial.size if origin else 0
    retries = 0
    limit = RateLimit(rate_limit)
    try:
        while True:
            headers = {}
            if origin is not None and partial.size:
                headers = {"Range": f"bytes={partial.size}-", "If-Range": origin.etag}
            try:
                # digest=trailer: a file's sha256 after its data (one read on the agent);
                # an agent that predates it sends the digest up front, as before.
                query = rp.params(**{wire.PARAM_DIGEST: wire.DIGEST_TRAILER},
                                  **({wire.PARAM_SYMLINK: wire.SYMLINK_KEEP}
                                     if keep_symlink else {}))
                async with conn.request("GET", rp.url(), params=query,
                                        headers=headers) as resp:
                    st = decode_stat(resp.headers.get(wire.HEADER_STAT))
                    ctype = resp.headers.get("Content-Type", "")
                    if ctype.startswith("application/x-tar") or st.get("type") == "dir":
                        partial.discard()
                        return await _receive_dir(resp, dest, st, progress)
                    if st.get("type") == "symlink":
                        partial.discard()
                        if not keep_symlink:  # whatever the server did with the query
                            raise UnsafeArchive.from_message(
                                f"{rp.path} is a symbolic link to "
                                f"{st.get('linkTarget')!r}; not copied (-P copies the link)")
                        return _make_symlink(dest, st)
                    origin, want = _check_origin(resp, rp, partial, origin, st)
                    progress.start(origin.size, partial.size)
                    tail = await _receive_file(resp, partial, progress, backoff, limit,
                                               trailer=want is None)
                    if partial.size != origin.size:
                        raise TransferError.from_message(
                            f"download ended at {partial.size} of {origin.size} bytes")
                want = want or tail.hex()  # the trailer: the whole file's sha256
                got = partial.hash.hexdigest()
                if got != want:
                    partial.discard()
                    raise IntegrityError.from_message(
                        f"sha256 mismatch for {rp.path}: got {got}, server says {want}"
                        "; nothing was written")
                mode = st.get("mode") if isinstance(st.get("mode"), int) else None
                # Not preserved: what a newly created file gets (0666 minus the umask).
                partial.commit(mode if preserve else 0o666)
                return Result(str(dest), "file", origin.size, got, resumed_from, retries)
            except RangeNotSatisfiable:
                # The partial file is longer than the file now is: start over.
                if origin is None:
                    raise
                partial.discard()
                origin = None
            except CATCH as exc:
                if isinstance(exc, IntegrityError):
                    raise
                await wait_or_raise(backoff, exc)
                retries += 1
    finally:
        partial.close()


async def _receive_file(resp: aiohttp.ClientResponse, partial: PartialFile,
                        progress: Progress, backoff: Backoff, limit: RateLimit, *,
                        trailer: bool = False) -> bytes:
    """Receive the body into ``partial``; with ``trailer``, its last 32 bytes are the
    sha256 and are returned, not written (the checked Content-Length holds them)."""
    # Decrypted straight into buffers of our own (a file has a Content-Length), which
    # the writer thread writes and hashes as they are.
    body = ResponseBody(resp)
    left = (resp.content_length or 0) - wire.SHA256_TRAILER_SIZE if trailer else -1
    tail = bytearray()  # never more than the trailer: split off by length

    async def read(n: int) -> bytes | memoryview:
        nonlocal left
        while True:
            piece = await body.next_piece()
            data = piece if left < 0 or len(piece) <= left else piece[:left]
            if len(data) < len(piece):
                tail.extend(piece[len(data):])
                if len(tail) > wire.SHA256_TRAILER_SIZE:  # the body's length forbids it
                    raise TransferError.from_message("the download ran past its trailer")
            if left >= 0:
                left -= len(data)
            if data or not piece:  # data, or the body's end; else trailer only: read on
                break
        if data:
            progress.advance(len(data))
            backoff.progressed()
            await limit.pace(len(data))
        return data

    loop = asyncio.get_running_loop()
    try:
        await pump(read, lambda pieces: loop.run_in_executor(None, partial.write_many, pieces),
                   keep_received=True)
    finally:
        if body.receiver is not None:
            resp.close()  # its connection is ours now: not reusable
    return bytes(tail)


def _check_origin(resp: aiohttp.ClientResponse, rp: RemotePath, partial: PartialFile,
                  origin: Origin | None, st: dict[str, Any]) -> tuple[Origin, str | None]:
    """The file's origin, and its sha256 from the head (None: it comes after the data,
    digest=trailer, and the Content-Length counts it)."""
    sha = response_sha256(resp.headers)
    trailer = resp.headers.get(wire.HEADER_SHA256) == wire.DIGEST_TRAILER
    if sha is None and not trailer:
        raise TransferError.from_message("the server sent no sha256 for the file; refusing "
                                         "an unverifiable download")
    length = resp.content_length
    if length is None and (trailer or resp.status != 206):
        raise TransferError.from_message("the server sent no Content-Length for the file")
    data = (length or 0) - (wire.SHA256_TRAILER_SIZE if trailer else 0)
    etag = resp.headers.get("ETag", "")
    if resp.status == 206:
        cr = _content_range(resp.headers.get("Content-Range"))
        if (origin is None or cr is None or cr[0] != partial.size or cr[2] != origin.size
                or (sha is not None and origin.sha256 and sha != origin.sha256)):
            raise TransferError.from_message("the server's partial reply does not continue "
                                             "the bytes already here")
        if trailer and (cr[1] != cr[2] - 1 or data != cr[1] - cr[0] + 1):
            raise TransferError.from_message("the server's partial reply is not framed as "
                                             "its range and a sha256 trailer")
        return origin, sha
    size = st.get("size")
    if data < 0 or (trailer and isinstance(size, int) and size != data):
        raise TransferError.from_message(f"the server's reply of {length} bytes is not "
                                         f"framed as a file of {size} and a sha256 trailer")
    fresh = Origin(rp.source(), etag, data, sha or "")
    partial.start(fresh)
    return fresh, sha


async def _receive_dir(resp: aiohttp.ClientResponse, dest: Path, st: dict[str, Any],
                       progress: Progress) -> Result:
    progress.start(None)
    # The chunked tar is decrypted straight into our buffers (aggapi.serve.chunktakeover).
    body = ResponseBody(resp)
    try:
        res = await extract_dir(TarReader(body), dest, progress.advance)
    finally:
        if body.receiver is not None:
            resp.close()  # its connection is ours now: not reusable
    return Result(res.path, "dir", res.bytes, "", entries=res.entries, skipped=res.skipped,
                  refused=res.refused, verified=res.verified)


def _make_symlink(dest: Path, st: dict[str, Any]) -> Result:
    target = st.get("linkTarget")
    if not isinstance(target, str) or not target:
        raise TransferError.from_message("symlink without a target")
    # The container names the target: a link to /root/.kube/config (or ../../x) would
    # turn "the downloaded file" into one of the user's own files.
    if not link_stays_inside(dest.parent, [], target):
        raise UnsafeArchive.from_message(
            f"refusing to create symlink {dest} -> {target!r}: it points outside "
            f"{dest.parent}")
    tmp = dest.with_name(f".{dest.name}.ncp-link")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, dest)
    return Result(str(dest), "symlink")
