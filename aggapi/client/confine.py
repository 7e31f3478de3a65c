"""Where a symlink leads inside a directory tree, decided against the disk, never lexically.

A hostile container chooses every link target in a download. Checking the text
of a target (``a/../b``) is not enough: ``x/l1 -> ..`` makes ``x/l1/x/l1/../..``
climb twice as far as it reads. :func:`resolve_beneath` therefore walks the
target one component at a time from a directory fd, reading each existing
component with ``lstat``/``readlink`` relative to that fd and following the
symlinks it meets the way the kernel would. A component that does not exist is
taken literally, as ``os.path.realpath`` does, so a link dangling today cannot
be judged more leniently than realpath judges it. Absolute targets, a step
above the root, and loops (more than 40 links) all count as leaving the tree.

Pure Python over ``*at`` calls (``dir_fd``), so it behaves the same on Linux
and macOS; no ``openat2`` is needed because the tree being checked is a private
temp directory that only this process writes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

MAX_LINKS = 40  # the kernel's limit (MAXSYMLINKS) on links followed in one lookup


def resolve_beneath(rootfd: int, start: Sequence[str], target: str, *,
                    max_links: int | None = None) -> list[str] | None:
    """The components below ``rootfd`` that ``target``, read in directory ``start``
    (components below the root, none of them a symlink), leads to; None when it
    leaves the root, is absolute, or follows more than ``max_links`` further links
    (default: the kernel's 40, so a loop counts as leaving)."""
    budget = [MAX_LINKS if max_links is None else max_links]
    return _walk(rootfd, list(start), target, budget)


def _walk(rootfd: int, stack: list[str], target: str, budget: list[int]) -> list[str] | None:
    if not target or target.startswith("/") or "\0" in target:
        return None
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return None
            stack.pop()
            continue
        rel = "/".join([*stack, part])
        try:
            st = os.stat(rel, dir_fd=rootfd, follow_symlinks=False)
        except OSError:
            stack.append(part)  # missing (or below a file): literal, as realpath has it
            continue
        if not stat.S_ISLNK(st.st_mode):
            stack.append(part)
            continue
        budget[0] -= 1
        if budget[0] < 0:
            return None
        try:
            link = os.readlink(rel, dir_fd=rootfd)
        except OSError:
            return None
        found = _walk(rootfd, stack, link, budget)
        if found is None:
            return None
        stack = found
    return stack


def link_stays_inside(root: str | os.PathLike[str], start: Sequence[str], target: str) -> bool:
    """Whether a link in ``root/start`` pointing to ``target`` resolves inside ``root``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return resolve_beneath(fd, start, target) is not None
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # macOS and old kernels: set and restore (a CLI sets no umask concurrently).
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def local_mode(mode: int, umask: int) -> int:
    """A downloaded file's mode as tar without -p gives it: permission bits only, minus
    the umask (no setuid, setgid or sticky bit from the container)."""
    return mode & 0o777 & ~umask
