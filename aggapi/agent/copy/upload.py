"""Uploads: one raw file, or a tar extracted into a directory, never in place.

Raw: the body streams into an :class:`~aggapi.agent.copy.atomic.AtomicFile` in
the target's directory (resolved in-root with openat2) in 1 MiB chunks, one
chunk being written by a worker while the next arrives: memory does not grow
with the file size.

Tar (``format=tar``): the body is parsed as a stream (never extractall), in worker
threads with bounded metadata (:mod:`aggapi.agent.copy.untar`). Entry
names must be relative and free of '..' and NUL; every entry is resolved under
the target directory with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so
neither '..' nor a symlink (from the tar or swapped in by the container) can
lead out. Regular files, symlinks and hard links are written as temp files and
renamed into place only after the whole tar was read and its size and sha256
checked; a hard link may only name an earlier regular file of the same tar.
Device nodes and FIFOs are refused. Missing directories are created as the tar
goes and removed again if the upload fails. Tar entry modes lose setuid/setgid;
owners are the uid=/gid= parameters or the user the copy acts as (the container
process's; its root under --copy-as-root, as docker cp), and the kernel decides,
as that user, whether the owner may be set.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import StreamReader

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.atomic import (
    SETID,
    AtomicFile,
    Owner,
    check_replaceable,
    rmdir_quiet,
    unlink_quiet,
)
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.fsroot import FsRoot, check_name, split_parent
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.untar import TarSink, entry_parts
from aggapi.status import StatusError
from aggapi.tarstream import ByteStream, TarError

CHUNK = 1 << 20
RDIR = os.O_RDONLY | os.O_DIRECTORY


@dataclass(frozen=True)
class UploadParams:
    overwrite: bool = True
    owner: Owner = field(default_factory=Owner)
    sha256: str | None = None
    tar: bool = False


async def _settle(aw: Awaitable[Any]) -> None:
    """Finish clean-up even if the request task is being cancelled."""
    fut = asyncio.ensure_future(aw)
    try:
        await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


async def pump(state: CopyState, root: FsRoot, read: Callable[[int], Awaitable[bytes]],
               write: Callable[[list[bytes]], None]) -> None:
    """Copy ``read`` to ``write`` (run in a worker) with about two MiB in memory at most.

    Pieces are handed over as a list (written with writev), never joined: the event
    loop, which also decrypts TLS, copies no byte of the body."""
    batch: list[bytes] = []
    held = 0
    pending: asyncio.Future[None] | None = None
    try:
        while True:
            data = await read(CHUNK)
            if not data:
                break
            batch.append(data)
            held += len(data)
            if held >= CHUNK:
                root.ensure_alive()
                if pending is not None:
                    await pending
                pending = state.workers.submit(write, batch)
                batch, held = [], 0
        if pending is not None:
            await pending
            pending = None
        if batch:
            await state.workers.run(write, batch)
    finally:
        # Never let a write run on after the caller aborts and closes the file.
        if pending is not None and not pending.done():
            await asyncio.wait([pending])


class CountingStream:
    """The request body, counted against the size limit and hashed as it passes."""

    def __init__(self, body: ByteStream, state: CopyState) -> None:
        self.body = body
        self.state = state
        self.size = 0
        self.hash = hashlib.sha256()

    async def _seen(self, data: bytes) -> bytes:
        self.size += len(data)
        self.state.slots.check_size(self.size)
        if len(data) >= 65536:
            await self.state.workers.run(self.hash.update, data)
        else:
            self.hash.update(data)
        return data

    async def read(self, n: int = -1) -> bytes:
        return await self._seen(await self.body.read(n))

    async def readexactly(self, n: int) -> bytes:
        return await self._seen(await self.body.readexactly(n))


def _check_digest(params: UploadParams, digest: str, path: str) -> None:
    if params.sha256 is not None and digest != params.sha256.lower():
        raise StatusError(400, f"{path}: sha256 mismatch: received {digest}, expected "
                          f"{params.sha256}; target unchanged", reason="Invalid")


async def upload_file(state: CopyState, root: FsRoot, path: str, body: ByteStream,
                      content_length: int | None, params: UploadParams) -> dict[str, Any]:
    parent, name = split_parent(path)
    if not name:
        raise StatusError(409, "/: is a directory")
    check_name(name)
    if content_length is not None:
        state.slots.check_size(content_length)
    run = state.workers.run
    record = InflightRecord(state.limits.state_dir, root)
    try:
        dir_fd = await run(root.open, parent, RDIR)
    except OSError as exc:
        raise fs_status(exc, parent) from exc
    af: AtomicFile | None = None
    counted = CountingStream(body, state)
    try:
        replaced = await run(check_replaceable, dir_fd, name, path, params.overwrite)
        af = await run(AtomicFile, root, record, dir_fd, parent, name)

        async def read(n: int) -> bytes:
            # Hashing happens in AtomicFile.write; count only. aiohttp's readchunk hands
            # over a received piece as is (read(n) would join pieces: a copy).
            if isinstance(body, StreamReader):
                data, _ = await body.readchunk()
            else:
                data = await body.read(n)
            counted.size += len(data)
            state.slots.check_size(counted.size)
            return data

        await pump(state, root, read, af.write_many)
        digest = await run(af.finish, expect_size=content_length,
                           expect_sha256=params.sha256, owner=params.owner, replaced=replaced)
        await run(af.commit, params.overwrite)
        return {"path": path, "size": af.size, "sha256": digest}
    except OSError as exc:
        raise fs_status(exc, path) from exc
    finally:
        if af is not None:
            await _settle(run(af.abort))
        await _settle(run(_close_record, dir_fd, record))


def close_file(af: AtomicFile) -> None:
    af.close()
    os.close(af.dir_fd)


def _close_record(fd: int, record: InflightRecord) -> None:
    os.close(fd)
    record.done()


# --- tar --------------------------------------------------------------------------------
@dataclass
class _Pending:
    parent: str  # relative to the target ('' = the target itself)
    tmp: str
    name: str
    is_file: bool


class TarExtractor:
    """Blocking per-entry operations, relative to an open target directory fd."""

    def __init__(self, root: FsRoot, record: InflightRecord, target_fd: int, target: str,
                 params: UploadParams) -> None:
        self.root = root
        self.record = record
        self.target_fd = target_fd
        self.target = target.rstrip("/")
        self.params = params
        self.pending: dict[str, _Pending] = {}  # by entry path, in tar order
        self.files: dict[str, tuple[int, int]] = {}  # entry path -> (dev, ino) of its temp
        self.created: list[str] = []  # directories we made, for rollback

    def _full(self, rel: str) -> str:
        return f"{self.target}/{rel}" if rel else self.target or "/"

    def _ids(self, uid: int | None, gid: int | None) -> tuple[int, int]:
        o = self.params.owner
        duid, dgid = self.root.default_ids()
        return (self.root.uid_map.to_host(o.uid, "uid") if o.uid is not None else duid,
                self.root.gid_map.to_host(o.gid, "gid") if o.gid is not None else dgid)

    def open_parent(self, rel: str) -> int:
        """An fd on directory ``rel`` under the target, created (mkdir -p) if missing."""
        try:
            return o2.openat2(self.target_fd, rel or ".", RDIR, o2.UNDER_TARGET)
        except FileNotFoundError:
            pass
        fd = os.dup(self.target_fd)
        done: list[str] = []
        try:
            for comp in rel.split("/"):
                done.append(comp)
                self._mkdir(fd, comp, "/".join(done), 0o755)
                nfd = o2.openat2(fd, comp, RDIR, o2.UNDER_TARGET)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _mkdir(self, parent_fd: int, name: str, rel: str, mode: int) -> None:
        if rel in self.pending:
            raise StatusError(400, f"tar entry {rel!r} is both a file and a directory "
                              "(a symlink in a tar is never followed)")
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise StatusError(409, f"{self._full(rel)}: exists and is not a directory") \
                    from None
            return
        self.created.append(rel)
        fd = o2.openat2(parent_fd, name, RDIR | os.O_NOFOLLOW, o2.UNDER_TARGET)
        try:
            os.fchown(fd, *self._ids(None, None))
            os.fchmod(fd, mode & 0o1777)
        finally:
            os.close(fd)

    def _slot(self, rel: str) -> tuple[int, str, str]:
        """(parent fd, parent rel, name) for a new non-directory entry ``rel``."""
        parent, _, name = rel.rpartition("/")
        pfd = self.open_parent(parent)
        try:
            check_replaceable(pfd, name, self._full(rel), self.params.overwrite)
            old = self.pending.pop(rel, None)  # a later entry of the same name wins
            if old is not None:
                unlink_quiet(pfd, old.tmp)
                self.files.pop(rel, None)
        except BaseException:
            os.close(pfd)
            raise
        return pfd, parent, name

    def mkdir(self, rel: str, mode: int) -> None:
        parent, _, name = rel.rpartition("/")
        pfd = self.open_parent(parent)
        try:
            self._mkdir(pfd, name, rel, mode)
        finally:
            os.close(pfd)

    def begin_file(self, rel: str) -> AtomicFile:
        pfd, parent, name = self._slot(rel)
        try:
            af = AtomicFile(self.root, self.record, pfd, self._full(parent), name)
        except BaseException:
            os.close(pfd)
            raise
        self.pending[rel] = _Pending(parent, af.tmp, name, True)
        return af

    def end_file(self, af: AtomicFile, rel: str, size: int, mode: int, mtime_ns: int) -> None:
        try:
            o = self.params.owner
            af.finish(expect_size=size, expect_sha256=None, replaced=None, mtime_ns=mtime_ns,
                      owner=Owner(o.uid, o.gid, mode & ~SETID & 0o1777))
            assert af.fd is not None
            st = os.fstat(af.fd)
            self.files[rel] = (st.st_dev, st.st_ino)
        finally:
            close_file(af)

    def symlink(self, rel: str, target: str) -> None:
        if not target or "\0" in target or len(target.encode("utf-8", "surrogateescape")) > 4095:
            raise StatusError(400, f"tar entry {rel!r}: invalid symlink target")
        pfd, parent, name = self._slot(rel)
        try:
            tmp = self.record.temp_name(self._full(parent))
            os.symlink(target, tmp, dir_fd=pfd)
            self.pending[rel] = _Pending(parent, tmp, name, False)
            os.chown(tmp, *self._ids(None, None), dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(pfd)

    def hardlink(self, rel: str, link: str) -> None:
        src = "/".join(entry_parts(link))
        if src not in self.files or src not in self.pending:
            raise StatusError(400, f"tar entry {rel!r}: hard link to {link!r}, which is not an "
                              "earlier regular file of this tar")
        want = self.files[src]
        sp = self.pending[src]
        sfd = self.open_parent(sp.parent)
        try:
            fd = o2.openat2(sfd, sp.tmp, os.O_PATH | os.O_NOFOLLOW, o2.UNDER_TARGET)
        finally:
            os.close(sfd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != want or not stat.S_ISREG(st.st_mode):
                raise StatusError(409, f"tar entry {rel!r}: link source changed under us")
            pfd, parent, name = self._slot(rel)
            try:
                tmp = self.record.temp_name(self._full(parent))
                o2.link_fd(fd, pfd, tmp)
                self.pending[rel] = _Pending(parent, tmp, name, True)
                self.files[rel] = want
            finally:
                os.close(pfd)
        finally:
            os.close(fd)

    def commit(self) -> None:
        """Rename every temp into place, in tar order."""
        self.root.ensure_alive()
        while self.pending:
            rel, p = next(iter(self.pending.items()))
            pfd = self.open_parent(p.parent)
            try:
                check_replaceable(pfd, p.name, self._full(rel), self.params.overwrite)
                o2.renameat2(pfd, p.tmp, pfd, p.name,
                             0 if self.params.overwrite else o2.RENAME_NOREPLACE)
            finally:
                os.close(pfd)
            del self.pending[rel]

    def rollback(self) -> None:
        for p in self.pending.values():
            try:
                pfd = self.open_parent(p.parent)
            except (OSError, StatusError):
                continue
            try:
                unlink_quiet(pfd, p.tmp)
            finally:
                os.close(pfd)
        self.pending.clear()
        for rel in reversed(self.created):
            parent, _, name = rel.rpartition("/")
            try:
                pfd = o2.openat2(self.target_fd, parent or ".", RDIR, o2.UNDER_TARGET)
            except OSError:
                continue
            rmdir_quiet(pfd, name)


def open_target_dir(root: FsRoot, path: str) -> tuple[int, str | None]:
    """(fd, name we created or None) of the tar's target directory; creates one level."""
    try:
        return root.open(path, RDIR), None
    except FileNotFoundError:
        pass
    parent, name = split_parent(path)
    pfd = root.open(parent, RDIR)
    try:
        os.mkdir(name, 0o755, dir_fd=pfd)
        fd = o2.openat2(pfd, name, RDIR | os.O_NOFOLLOW, o2.UNDER_TARGET)
        os.fchown(fd, *root.default_ids())
        return fd, name
    finally:
        os.close(pfd)


def _remove_created_target(root: FsRoot, path: str, name: str | None) -> None:
    if name is None:
        return
    parent, _ = split_parent(path)
    try:
        pfd = root.open(parent, RDIR)
    except OSError:
        return
    rmdir_quiet(pfd, name)


async def upload_tar(state: CopyState, root: FsRoot, path: str, body: ByteStream,
                     content_length: int | None, params: UploadParams) -> dict[str, Any]:
    if content_length is not None:
        state.slots.check_size(content_length)
    run = state.workers.run
    limits = state.limits
    record = InflightRecord(limits.state_dir, root)
    try:
        target_fd, made = await run(open_target_dir, root, path)
    except OSError as exc:
        raise fs_status(exc, path) from exc
    ex = TarExtractor(root, record, target_fd, path, params)
    # The loop only receives and counts; parsing and extraction happen in workers
    # (untar.TarSink), a batch of about a MiB at a time.
    sink = TarSink(ex, root, limits)
    received = 0

    async def read(n: int) -> bytes:
        nonlocal received
        if isinstance(body, StreamReader):
            data, _ = await body.readchunk()
        else:
            data = await body.read(n)
        received += len(data)
        state.slots.check_size(received)
        return data

    ok = False
    try:
        try:
            await pump(state, root, read, sink.feed_many)
            await run(sink.finish)
        finally:
            await _settle(run(sink.abort))
        if content_length is not None and sink.size != content_length:
            raise StatusError(400, f"received {sink.size} bytes, expected {content_length}")
        digest = sink.hash.hexdigest()
        _check_digest(params, digest, path)
        await run(ex.commit)
        ok = True
        return {"path": path, "size": sink.size, "sha256": digest, "entries": sink.entries}
    except TarError as exc:
        raise StatusError(400, f"invalid tar: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StatusError(400, f"{path}: a tar entry's path crosses a symlink; refused "
                              "(tar entries are resolved without following symlinks)") from exc
        raise fs_status(exc, path) from exc
    finally:
        if not ok:
            await _settle(run(ex.rollback))
            await _settle(run(_remove_created_target, root, path, made))
        await _settle(run(_close_record, target_fd, record))
