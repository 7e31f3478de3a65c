"""A directory upload's target: the existing directory, or a private one made beside
it (recorded first, so a crash's clean-up finds it) for the tree to be built in and
published whole by one rename (aggapi.agent.copy.tarextract.TarExtractor), or removed
whole when the upload fails."""

from __future__ import annotations

import logging
import os

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.atomic import rmdir_quiet
from aggapi.agent.copy.cleanup import InflightRecord, remove_tree
from aggapi.agent.copy.fsroot import FsRoot, check_name, split_parent

log = logging.getLogger(__name__)

RDIR = os.O_RDONLY | os.O_DIRECTORY


def open_target_dir(root: FsRoot, path: str, record: InflightRecord
                    ) -> tuple[int, str | None]:
    """(fd, None) of the tar's target directory; if it does not exist (its parent must),
    (fd, temp name) of a private directory made beside it (recorded first, mode 0700,
    owned as the target will be) for TarExtractor(fresh=) to build the tree in."""
    try:
        return root.open(path, RDIR), None
    except FileNotFoundError:
        pass
    parent, name = split_parent(path)
    check_name(name)
    pfd = root.open(parent, RDIR)
    try:
        tmp = record.temp_name(parent)
        os.mkdir(tmp, 0o700, dir_fd=pfd)
        try:
            fd = o2.openat2(pfd, tmp, RDIR | os.O_NOFOLLOW, o2.UNDER_TARGET)
            try:
                os.fchown(fd, *root.default_ids())
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            rmdir_quiet(os.dup(pfd), tmp)
            raise
        return fd, tmp
    finally:
        os.close(pfd)


def remove_created_target(root: FsRoot, path: str, tmp: str | None) -> None:
    """Remove the private tree ``tmp`` beside ``path`` (open_target_dir's), if still there."""
    if tmp is None:
        return
    parent, _ = split_parent(path)
    try:
        pfd = root.open(parent, RDIR)
    except OSError:
        return
    try:
        remove_tree(pfd, tmp)
    except OSError as exc:  # the crash clean-up (the record) comes back for it
        log.warning("upload's private tree %s/%s in %s not removed: %s", parent.rstrip("/"),
                    tmp, root.container_id, exc)
    finally:
        os.close(pfd)
