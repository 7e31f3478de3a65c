"""Fresh journaled ext4 file systems for ``bench_kubectl_cp --installed``: each
transfer's files on a file system made just before it, so no tool creates files near
earlier deletions.

Why: this VM's root ext4 has no journal. There, a new inode within ~30 s of mass
deletions in its block group skips every recently freed one (fs/ext4/ialloc.c,
``recently_deleted``, checked only without a journal), reading inode-table blocks as it
goes; and the root fills and fragments over days. The same 10,000-file upload by the
same code took 1.50 s in one run and 2.41 s in another. Production nodes run a
journaled ext4 or xfs, never a journal-less root.

Each file system is a sparse image in the bench's work directory, made by mkfs.ext4
with a journal, attached to a loop device of its own (direct I/O: the image's pages are
not cached a second time) and mounted either on this host or inside a node's mount
namespace (an ``nsenter`` argv prefix). For the pod side, :meth:`FreshFs.share` first
makes a directory a shared mount in the node's namespace: a pod with a hostPath volume
on it and ``mountPropagation: HostToContainer`` then sees every file system mounted
below it afterwards, and so does the agent, which resolves paths from
``/proc/<pid>/root``, in the container's mount namespace.

Everything is recorded as it is made and undone in reverse by :meth:`FreshFs.close`:
unmount, remove the mount point, detach the loop device, remove the image; by the
paths and devices recorded, never by a name pattern. A step that fails is reported;
the rest of its file system's steps are skipped (a device still mounted is not
detached, its image not removed) and the other file systems' still run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

MiB = 1 << 20
Runner = Callable[[list[str]], str]


def run_cmd(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def image_bytes(payload: int) -> int:
    """A sparse image's size for ``payload`` bytes of files: room for two copies (a
    tree built privately beside its target, say) and for ext4's inode tables and
    journal; unwritten parts of the image cost nothing."""
    return max(1024 * MiB, 2 * payload + 512 * MiB)


class FreshFs:
    """The file systems, shared mount points and loop devices of one bench scenario
    (or run), all removed again by :meth:`close`."""

    def __init__(self, images: Path, run: Runner = run_cmd) -> None:
        self.images = images
        self.run = run
        # (file system, what, how), in the order made; a file system's steps after a
        # failed one are skipped.
        self.undo: list[tuple[int, str, Callable[[], object]]] = []
        self.made = 0

    def _did(self, what: str, undo: Callable[[], object]) -> None:
        self.undo.append((self.made, what, undo))

    def share(self, where: Path, prefix: Sequence[str] = ()) -> Path:
        """``where`` (made here) as a shared mount in the mount namespace ``prefix``
        enters: mounts below it propagate to a container's HostToContainer volume."""
        self.made += 1
        where.mkdir()
        self._did(f"rmdir {where}", where.rmdir)
        self.run([*prefix, "mount", "--bind", str(where), str(where)])
        self._did(f"umount {where}", lambda: self.run([*prefix, "umount", str(where)]))
        self.run([*prefix, "mount", "--make-shared", str(where)])
        return where

    def make(self, name: str, where: Path, size: int, prefix: Sequence[str] = ()) -> Path:
        """A new journaled ext4 of ``size`` bytes mounted at ``where/name``."""
        self.made += 1
        self.images.mkdir(parents=True, exist_ok=True)
        image = self.images / f"{name}.img"
        with image.open("xb") as f:  # x: never take over another's image
            f.truncate(size)
        self._did(f"rm {image}", image.unlink)
        # A journal whatever mke2fs.conf says; no discard of the sparse file's blocks.
        self.run(["mkfs.ext4", "-q", "-F", "-O", "has_journal", "-E", "nodiscard",
                  str(image)])
        dev = self.run(["losetup", "--find", "--show", "--direct-io=on", str(image)]).strip()
        if not dev.startswith("/dev/"):
            raise RuntimeError(f"losetup gave no device for {image}: {dev!r}")
        self._did(f"losetup -d {dev}", lambda: self.run(["losetup", "-d", dev]))
        mnt = where / name
        mnt.mkdir()
        self._did(f"rmdir {mnt}", mnt.rmdir)
        # noinit_itable: no ext4lazyinit thread zeroing inode tables during a transfer.
        self.run([*prefix, "mount", "-t", "ext4", "-o", "noinit_itable", dev, str(mnt)])
        self._did(f"umount {mnt}", lambda: self.run([*prefix, "umount", str(mnt)]))
        return mnt

    def close(self) -> list[str]:
        """Undo everything, newest first; the steps that failed, as messages."""
        failed: list[str] = []
        kept: set[int] = set()  # file systems whose undoing stopped at a failure
        while self.undo:
            fs, what, step = self.undo.pop()
            if fs in kept:
                continue
            try:
                step()
            except (OSError, subprocess.CalledProcessError) as exc:
                detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) \
                    and exc.stderr else str(exc)
                failed.append(f"{what}: {detail}")
                kept.add(fs)
        return failed


@contextmanager
def fresh_fs(images: Path, run: Runner = run_cmd,
             warn: Callable[[str], object] = print) -> Iterator[FreshFs]:
    fs = FreshFs(images, run)
    try:
        yield fs
    finally:
        for msg in fs.close():
            warn(f"bench: clean-up failed: {msg}")
