"""A container's file system seen only through file descriptors.

:class:`FsRoot` holds a dirfd on ``/proc/<pid>/root`` (or any directory, for
tests), the pidfd of that process and its id maps. Every container path is
checked by :func:`clean_path` and resolved with openat2(RESOLVE_IN_ROOT |
RESOLVE_NO_MAGICLINKS) on the dirfd: '/', '..' and absolute symlinks stop at
the container root and /proc magic links are refused. Methods block; callers
run them in worker threads.

A relative path (``kubectl cp pod:dir/file``) is resolved by
:meth:`FsRoot.absolute` against the process's working directory as the
container sees it, the way the kernel walks it (never textually: ``dir/link/..``
is where ``link`` leads, then up), each component looked up in-root; the clean
absolute path it gives goes through :func:`clean_path` like any other, and
openat2 still confines every lookup.

``creds`` is the identity copies act as (see aggapi.agent.copy.creds): the
container process's, or None to act as the agent (root; ``--copy-as-root``).
"""

from __future__ import annotations

import errno
import os
import select
import stat
from dataclasses import dataclass, field

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.creds import Creds
from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.idmap import IdMap
from aggapi.agent.copy.pseudofs import is_magic_link
from aggapi.status import StatusError

MAX_PATH = 4096
MAX_NAME = 255
MAX_LINKS = 40  # the kernel's limit (MAXSYMLINKS) on symlinks followed in one lookup


def clean_path(path: str | None) -> str:
    """The normalised absolute container path, or a 400.

    Relative paths, NUL bytes and '..' components are refused outright even
    though openat2 would contain them: a request that tries is never legit."""
    if not path:
        raise StatusError(400, "path is required")
    if "\0" in path:
        raise StatusError(400, "path contains a NUL byte")
    if not path.startswith("/"):
        raise StatusError(400, f"path must be absolute: {path!r}")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise StatusError(400, "path too long")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StatusError(400, f"path must not contain '..': {path!r}")
    if any(len(p.encode("utf-8", "surrogateescape")) > MAX_NAME for p in parts):
        raise StatusError(400, "path component too long")
    return "/" + "/".join(parts)


def request_path(path: str | None) -> str:
    """A requested path as the capability names it: absolute ones cleaned, relative
    ones (resolved later against the container's cwd) only checked."""
    if path and not path.startswith("/"):
        if "\0" in path:
            raise StatusError(400, "path contains a NUL byte")
        if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
            raise StatusError(400, "path too long")
        return path
    return clean_path(path)


def in_root(link: str, root: str) -> str | None:
    """``link`` (a /proc/<pid>/cwd target) as a path below ``root`` (the process's
    /proc/<pid>/root target), both read from the agent's side; None if outside."""
    link = link.removeprefix("(unreachable)")
    if not link.startswith("/") or link.endswith(" (deleted)"):
        return None
    if root == "/":  # another mount namespace: the kernel already shows its view
        return link
    if link == root:
        return "/"
    return link[len(root):] if link.startswith(root.rstrip("/") + "/") else None


def split_parent(path: str) -> tuple[str, str]:
    """('/a', 'b') for '/a/b'; ('/', '') for '/'. ``path`` must be clean."""
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def check_name(name: str) -> str:
    """A single directory entry name we may create."""
    if (not name or name in (".", "..") or "/" in name or "\0" in name
            or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME):
        raise StatusError(400, f"invalid file name {name!r}")
    return name


@dataclass
class FsRoot:
    """A container root dirfd plus what proves it is still that container."""

    root_fd: int
    uid_map: IdMap = field(default_factory=IdMap.identity)
    gid_map: IdMap = field(default_factory=IdMap.identity)
    pidfd: int | None = None
    pid: int | None = None
    container_id: str = ""
    pod_uid: str = ""
    container_name: str = ""
    creds: Creds | None = None
    closed: bool = False

    @property
    def as_user(self) -> bool:
        """Copies act as an unprivileged user: the kernel checks every permission."""
        return self.creds is not None and not self.creds.privileged

    def default_ids(self) -> tuple[int, int]:
        """Host (uid, gid) new files get when the upload names none: the user copies
        act as, or the container's root (as docker cp) when acting as root."""
        if self.creds is not None:
            return self.creds.uid, self.creds.gid
        return self.uid_map.to_host(0, "uid"), self.gid_map.to_host(0, "gid")

    def who(self) -> str:
        """The identity copies act as, in the container's ids, for messages and logs."""
        if self.creds is None:
            return "root (--copy-as-root)"
        return (f"uid {self.uid_map.to_container(self.creds.uid)} "
                f"gid {self.gid_map.to_container(self.creds.gid)}")

    def alive(self) -> bool:
        """False once the container's process exited (pidfd turns readable)."""
        if self.pidfd is None:
            return True
        p = select.poll()
        p.register(self.pidfd, select.POLLIN)
        return not p.poll(0)  # non-blocking: a zero timeout never waits

    def ensure_alive(self) -> None:
        if not self.alive():
            raise StatusError(409, f"container {self.container_name or self.container_id} "
                              "exited during the copy; nothing was committed")

    def cwd(self, proc: str = "/proc") -> str:
        """Blocking: the process's working directory as the container sees it ("/"
        for a plain directory root). readlink shows a process of another mount
        namespace its own view, a chrooted one (tests) the host path: strip its root."""
        if self.pid is None:
            return "/"
        try:
            cwd = in_root(os.readlink(f"{proc}/{self.pid}/cwd"),
                          os.readlink(f"{proc}/{self.pid}/root"))
        except OSError as exc:
            raise StatusError(409, f"container {self.container_name or self.container_id}: "
                              f"cannot read its working directory: {exc.strerror}") from exc
        self.ensure_alive()  # the pid was still this container's when it was read
        if cwd is None:
            raise StatusError(409, f"container {self.container_name or self.container_id}: "
                              "its working directory is outside its root")
        return cwd

    def absolute(self, path: str) -> str:
        """Blocking: the clean absolute container path of a requested one; a relative
        path starts at the process's cwd and is walked as the kernel walks it."""
        if path.startswith("/"):
            return clean_path(path)
        cwd = self.cwd()
        try:
            return self.walk(cwd, path)
        except OSError as exc:
            # Named as asked, from the working directory: "/relative/path: not found".
            raise fs_status(exc, cwd.rstrip("/") + "/" + path) from exc

    def walk(self, start: str, rel: str) -> str:
        """Blocking: the clean path the kernel reaches from directory ``start`` by
        ``rel``, its last component named but not followed (as every copy opens its
        path) unless a '/' follows it. Every other component is looked up in-root,
        as the copy's user: a symlink is followed (at most :data:`MAX_LINKS`; an
        absolute one from the root; a /proc magic link refused, ELOOP, as openat2
        refuses it), '..' climbs from where the walk is, never above the root, and a
        component that is not a directory is ENOTDIR. A later change of the tree is
        no escape: the result is opened in-root again."""
        done = [p for p in start.split("/") if p]
        todo = [p for p in reversed(rel.split("/")) if p]  # the next one last
        if rel.endswith("/"):  # "link/" is the directory the link leads to, as in open(2)
            todo.insert(0, ".")
        links = 0
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            if not todo:  # the last component: named, not followed
                done.append(name)
                break
            here = clean_path("/" + "/".join([*done, name]))
            fd = self.open(here, os.O_PATH | os.O_NOFOLLOW)
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISLNK(mode):
                    links += 1
                    if links > MAX_LINKS or is_magic_link(self.root_fd, here, fd):
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), here)
                    target = os.readlink("", dir_fd=fd)
                    if target.startswith("/"):
                        done = []
                    todo.extend(p for p in reversed(target.split("/")) if p)
                    continue
                if not stat.S_ISDIR(mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
            finally:
                os.close(fd)
            done.append(name)
        return clean_path("/" + "/".join(done))

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """Open a clean container path; callers add O_NOFOLLOW for the last component."""
        return o2.openat2(self.root_fd, path, flags, o2.IN_CONTAINER, mode)

    def open_dir(self, path: str) -> int:
        """An O_PATH dirfd of a container directory (symlinks inside followed in-root)."""
        return self.open(path, os.O_PATH | os.O_DIRECTORY)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.root_fd, self.pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
