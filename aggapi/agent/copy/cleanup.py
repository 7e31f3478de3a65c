"""In-flight upload records, so temp files left by a killed agent get removed.

Every upload request gets a random token; its temp files are named
``.aggapi-tmp-<token>-<n>`` in the directory they will be renamed into. Before
the first temp file is created in a directory, one JSON line naming that
directory is appended to ``<state_dir>/<token>.jsonl`` (whose first line names
the container by its id, stable across agent restarts, unlike pids). The writer holds
an exclusive flock on its record while it lives, so an agent starting beside a live one
(a DaemonSet rolling with maxSurge, or a replacement created during the old pod's grace
period) leaves that agent's uploads alone; :func:`cleanup_stale` returns such records as
pending and the engine comes back for them once the lock is released. A clean finish
deletes the record. At start-up :func:`cleanup_stale` re-opens each recorded container
and directory through openat2 and unlinks only names with that token. When that
container is gone, the pod's current instance of the same container (found by pod uid
and container name, as after a restart or a recreated sandbox) is cleaned instead: the
temp file may be in a volume that outlived the old container. Records with neither are
dropped, and so is a record whose temp files the container's user may not remove (the
container made the directory read-only): the failure is logged and the pass goes on.
A temp name may also be a directory: the private tree a tar upload into a new target
builds before publishing it by one rename (:mod:`aggapi.agent.copy.tarextract`); it is
removed with all it holds.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from aggapi.agent.copy import creds
from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.workers import Workers
from aggapi.status import StatusError

log = logging.getLogger(__name__)

TMP_PREFIX = ".aggapi-tmp-"
RDIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class InflightRecord:
    """The record of one upload request. Methods block: call them in a worker thread."""

    def __init__(self, state_dir: str, root: FsRoot) -> None:
        self.token = secrets.token_hex(8)
        self.path = os.path.join(state_dir, f"{self.token}.jsonl")
        self.root = root
        self.dirs: set[str] = set()
        self._seq = 0
        self._fd: int | None = None

    def _append(self, obj: dict[str, object]) -> None:
        with creds.as_agent():  # the agent's own file, not the container user's
            self._append_as_agent(obj)

    def _append_as_agent(self, obj: dict[str, object]) -> None:
        if self._fd is None:
            try:
                os.makedirs(os.path.dirname(self.path), 0o700, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                   | os.O_APPEND | os.O_CLOEXEC, 0o600)
                # Held until done() or this process dies: the record is a live upload's.
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as exc:  # not the target's fault: never report it as such
                raise StatusError(500, f"agent copy state dir unusable: {exc}") from exc
            head = {"containerId": self.root.container_id, "podUid": self.root.pod_uid,
                    "container": self.root.container_name, "token": self.token,
                    "created": time.time()}
            os.write(self._fd, (json.dumps(head) + "\n").encode())
        os.write(self._fd, (json.dumps(obj) + "\n").encode())

    def temp_name(self, dir_path: str) -> str:
        """A fresh temp name for ``dir_path``, recorded before the file exists."""
        if dir_path not in self.dirs:
            self._append({"dir": dir_path})
            self.dirs.add(dir_path)
        self._seq += 1
        return f"{TMP_PREFIX}{self.token}-{self._seq}"

    def done(self) -> None:
        with creds.as_agent():
            self._done_as_agent()

    def _done_as_agent(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def read_records(state_dir: str, only: Collection[str] | None = None
                 ) -> tuple[list[tuple[str, dict[str, object], list[str]]], set[str]]:
    """(record file, head, dirs) for every record not locked by a live upload, and the
    locked ones' paths. ``only``: just these record files. Unreadable ones are dropped."""
    out = []
    locked: set[str] = set()
    try:
        names = os.listdir(state_dir)
    except FileNotFoundError:
        return [], locked
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(state_dir, name)
        if only is not None and path not in only:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                try:  # released when the file closes
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    locked.add(path)  # a live agent's upload (one beside this agent)
                    continue
                lines = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            log.warning("dropping unreadable copy record %s", path)
            _unlink(path)
            continue
        if not lines or "token" not in lines[0]:
            _unlink(path)
            continue
        dirs = [str(d["dir"]) for d in lines[1:] if "dir" in d]
        out.append((path, lines[0], dirs))
    return out, locked


def remove_temp_files(root: FsRoot, dirs: list[str], token: str) -> int:
    """Unlink this token's temp files in each directory, as the container's user. Blocking."""
    with creds.acting_as(root.creds):
        return _remove_temp_files(root, dirs, token)


def _remove_temp_files(root: FsRoot, dirs: list[str], token: str) -> int:
    prefix = f"{TMP_PREFIX}{token}-"
    removed = 0
    for d in dirs:
        try:
            dfd = root.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            log.info("stale copy dir %s in %s: %s", d, root.container_id, exc)
            continue
        try:
            for name in os.listdir(dfd):
                if not name.startswith(prefix):
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        remove_tree(dfd, name)
                    else:
                        os.unlink(name, dir_fd=dfd)
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:  # e.g. the container made the dir 0555: go on
                    log.warning("stale copy temp file %s/%s in %s not removed: %s", d, name,
                                root.container_id, exc)
        except OSError as exc:  # listing refused: the other dirs still get cleaned
            log.warning("stale copy dir %s in %s not listed: %s", d, root.container_id, exc)
        finally:
            os.close(dfd)
    return removed


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove directory ``name`` in ``parent_fd`` and everything in it (gone already: a
    no-op). Each level is opened beneath the one above without following symlinks, so a
    link swapped in leads nowhere, and made writable first (a tar may have made it
    read-only). Iterative: a tree nested deeper than the interpreter's recursion limit
    is removed too. Raises the first OSError but ENOENT."""
    opened: list[tuple[int, str]] = []  # (fd, its name in the level above)
    try:
        try:
            opened.append((o2.openat2(parent_fd, name, RDIR_NOFOLLOW, o2.UNDER_TARGET), name))
        except FileNotFoundError:
            return
        while opened:
            fd = opened[-1][0]
            try:
                os.fchmod(fd, 0o700)
            except PermissionError:
                pass  # not ours to change: the unlinks below say whether it matters
            sub = None
            for entry in os.listdir(fd):
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:
                    sub = entry
                    break
                except FileNotFoundError:
                    pass
            if sub is not None:
                try:
                    opened.append((o2.openat2(fd, sub, RDIR_NOFOLLOW, o2.UNDER_TARGET), sub))
                except FileNotFoundError:
                    pass
                continue
            _, done = opened.pop()
            os.close(fd)
            try:
                os.rmdir(done, dir_fd=opened[-1][0] if opened else parent_fd)
            except FileNotFoundError:
                pass
    finally:
        for fd, _ in opened:
            os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def _successor(resolve: Callable[[str, str], Awaitable[FsRoot]] | None,
                     head: dict[str, object]) -> FsRoot | None:
    """The running instance of the record's container in the same pod, if any."""
    pod_uid, name = str(head.get("podUid") or ""), str(head.get("container") or "")
    if resolve is None or not pod_uid or not name:
        return None
    try:
        return await resolve(pod_uid, name)
    except StatusError:  # no such pod or container here, or not running
        return None


@dataclass
class CleanupPass:
    removed: int = 0  # temp files unlinked
    # Record files to come back to: locked by a live agent's upload, or the runtime did
    # not answer for their container.
    pending: set[str] = field(default_factory=set)


async def cleanup_stale(state_dir: str, by_id: Callable[[str], Awaitable[FsRoot | None]],
                        workers: Workers,
                        resolve: Callable[[str, str], Awaitable[FsRoot]] | None = None,
                        only: Collection[str] | None = None) -> CleanupPass:
    """Remove temp files recorded by a previous agent (``only``: of these record files).

    ``by_id`` finds a running container by its id (None when it is gone); ``resolve``
    (pod uid, container name) finds its successor when it is gone."""
    run = workers.run
    await run(os.makedirs, state_dir, 0o700, exist_ok=True)
    records, locked = await run(read_records, state_dir, only)
    done = CleanupPass(pending=locked)
    for path, head, dirs in records:
        try:
            root = await by_id(str(head.get("containerId", "")))
            if root is None:
                root = await _successor(resolve, head)
        except Exception as exc:  # runtime unreachable: keep the record, come back
            log.warning("copy record %s: cannot look up container: %s", path, exc)
            done.pending.add(path)
            continue
        if root is not None:
            try:
                done.removed += await run(remove_temp_files, root, dirs, str(head["token"]))
            except Exception as exc:  # one record's failure must not stop the pass
                log.warning("copy record %s: clean-up failed: %s", path, exc)
            finally:
                root.close()
        else:
            log.info("copy record %s: container gone, dropping", path)
        await run(_unlink, path)
    return done
