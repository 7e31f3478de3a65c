"""aiohttp handlers of the agent's /v1/copy endpoint (HEAD stat, GET download, POST upload).

Wire conventions (the aggapi apiserver relays them unchanged):

- ``X-Aggapi-Stat``: base64 of the JSON object {name, size, mode, mtime, uid,
  gid, linkTarget, type} of the requested path (not following its last
  component), on every successful HEAD and GET. ``mode`` is st_mode; ``type``
  one of file, dir, symlink, char, block, fifo, socket; ids as the container
  sees them.
- Regular file (GET): raw bytes, ``Content-Length`` (the size seen at lookup: a file
  grown since is not sent or hashed further), ``Accept-Ranges: bytes``,
  ``ETag`` from (inode, size, mtime), and the sha256 of the *whole* file as
  ``X-Aggapi-Sha256: <hex>``, ``Digest: sha-256=<base64>`` (RFC 3230) and
  ``Repr-Digest: sha-256=:<base64>:`` (RFC 9530), also on 206 replies so a
  client verifies after resuming. The digest is computed before the first
  byte (a full read in a worker thread, abandoned within a chunk when the client
  leaves) and cached by (dev, inode, size, mtime, ctime) once the file cannot
  change without a new key (aggapi.agent.copy.digests), so a resume does not pay
  for it again. With ``digest=trailer`` (a range to the end, digest not cached) the
  file is instead hashed as it is sent, read once, and the body ends with the whole
  file's raw sha256 (32 bytes, in Content-Length; bytes before a range are hashed
  first), announced by ``X-Aggapi-Sha256: trailer``; the digest is then cached on the
  same terms. ``Range: bytes=N-`` (or N-M, -K) gives 206 + Content-Range (a 416
  carries ``Content-Range: bytes */SIZE``); ``If-Range`` with another ETag gives 200
  and the whole file.
- HEAD: exactly GET's status and headers, without the body (Range ignored, as RFC
  9110 section 14.2 says); every operation, HEAD included, holds a copy slot in its
  namespace's bucket.
- Directory (GET): ``Content-Type: application/x-tar``, a PAX tar of its
  contents with names relative to it, each regular file's sha256 in its entry, or
  with ``digest=trailer`` in the entry after it, each file then read once
  (aggapi.tar.entrydigest); the closing "./" entry reports skipped entries (see
  aggapi.agent.copy.download).
- Symlink (GET): with ``symlink=keep`` an empty body, the stat header carrying
  linkTarget; without it 409 (as cp without -P: a link is not the file).
- Upload (POST): body = the file, or with format=tar a tar extracted into the
  directory ``path`` (created if only its last component is missing); optional
  sha256= (hex, or ``trailer``: the body's last 32 bytes are the raw sha256 of the
  bytes before them; for a tar also ``headers:<hex>`` or ``headers-trailer``, the
  headers digest of aggapi.tar.entrydigest), mode= (octal; the only way to set
  setuid/setgid), uid=, gid=, overwrite=true|false (default true). Reply: JSON {path, size, sha256}
  (+ entries for tar).
- Errors are metav1.Status (via aggapi.status); a failure after a download has
  started aborts the connection, so a cut stream never looks complete.

Authorization: the capability the auth middleware verified
(``request[aggapi.agent.auth.CAPABILITY]``) must be a copy capability for this
operation, naming the ``container`` and the ``path`` asked for. The upload
parameters must be those the capability vouches for; sha256 alone may come
from the query only (it restricts, never widens, what is written).
"""

from __future__ import annotations

import stat as st_
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from aggapi import wire
from aggapi.agent.auth import CAPABILITY
from aggapi.agent.copy import creds
from aggapi.agent.copy.fds import lookup
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.heads import stat_header
from aggapi.agent.copy.pace import PACE, MinRate, PacedBody
from aggapi.agent.copy.query import DownloadParams, download_params, target, upload_params
from aggapi.agent.copy.send import send_dir, send_file
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.upload import upload_file, upload_tar
from aggapi.auth.capability import Capability
from aggapi.status import StatusError


def _capability(request: web.Request, *ops: str) -> Capability:
    cap = request.get(CAPABILITY)
    if cap is None:
        raise StatusError(401, "a capability token is required")
    if cap.operation not in ops:
        raise StatusError(403, f"capability is for {cap.operation}, not {ops[0]}")
    return cap


@asynccontextmanager
async def _container(state: CopyState, cap: Capability, name: str) -> AsyncIterator[FsRoot]:
    root = await state.resolver.resolve(cap.pod_uid, name)
    try:
        with creds.serving(root.creds):  # every worker call of this copy acts as its user
            yield root
    except StatusError as exc:
        if exc.code == 403 and root.as_user and root.who() not in exc.message:
            exc.message += f" (copies act as the container's user, {root.who()})"
        raise
    finally:
        root.close()


def _symlink_wanted(params: DownloadParams, path: str, link: str | None) -> None:
    """A download of a symlink sends the link only when asked to (symlink=keep)."""
    if params.keep_symlink:
        return
    to = f" to {link!r}" if link else ""
    raise StatusError(409, f"{path}: is a symbolic link{to}; not followed. Ask for the link "
                      f"itself with {wire.PARAM_SYMLINK}={wire.SYMLINK_KEEP} (kubectl ncp -P)")


class CopyHandlers:
    """The /v1/copy routes, bound to the copy engine's state at construction."""

    def __init__(self, state: CopyState) -> None:
        self.state = state

    async def stat(self, request: web.Request) -> web.StreamResponse:
        """HEAD: exactly what GET would answer (status, headers), without the body."""
        cap = _capability(request, wire.OP_COPY_STAT, wire.OP_COPY_DOWNLOAD)
        return await self._read(request, cap, body=False)

    async def download(self, request: web.Request) -> web.StreamResponse:
        cap = _capability(request, wire.OP_COPY_DOWNLOAD)
        request[PACE] = MinRate(self.state.limits.min_rate, self.state.limits.rate_window)
        return await self._read(request, cap, body=True)

    async def _read(self, request: web.Request, cap: Capability, body: bool
                    ) -> web.StreamResponse:
        state = self.state
        container, path = target(request, cap)
        params = download_params(request)
        # HEAD holds a slot like any copy, in its namespace's bucket: it may hash a
        # file as big as the size limit.
        with state.slots.slot(cap.pod_uid, cap.pod_namespace):
            async with _container(state, cap, container) as root:
                path = await state.workers.run(root.absolute, path)
                async with lookup(state, root, path) as t:
                    if st_.S_ISDIR(t.st.st_mode):
                        return await send_dir(request, state, root, t, params.trailer, body,
                                              plain=not params.records)
                    if st_.S_ISLNK(t.st.st_mode):
                        _symlink_wanted(params, path, t.link)
                        # (Content-Length said outright: HEAD's reply would omit it)
                        return web.Response(status=200, headers={
                            **stat_header(root, t), "Content-Length": "0"})
                    return await send_file(request, state, root, t, params.trailer, body)

    async def upload(self, request: web.Request) -> web.StreamResponse:
        cap = _capability(request, wire.OP_COPY_UPLOAD)
        state = self.state
        container, path = target(request, cap)
        params = upload_params(request, cap)
        if request.content_length is not None:  # the data's: a sha256 trailer is not
            state.slots.check_size(request.content_length
                                   - (wire.SHA256_TRAILER_SIZE if params.sha256_trailer else 0))
        # A client that stops sending, or trickles, is cut off: the slot and the temp
        # files go with it.
        body = PacedBody(request.content, state.limits.body_idle_timeout,
                         MinRate(state.limits.min_rate, state.limits.rate_window))
        with state.slots.slot(cap.pod_uid, cap.pod_namespace):
            async with _container(state, cap, container) as root:
                path = await state.workers.run(root.absolute, path)
                send = upload_tar if params.tar else upload_file
                try:
                    result = await send(state, root, path, body, request.content_length,
                                        params)
                except StatusError:
                    if body.stalled is not None:  # the tar parser reports it as a short tar
                        raise body.stalled from None
                    raise
        return web.json_response(result)
