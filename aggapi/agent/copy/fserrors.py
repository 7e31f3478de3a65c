"""Map file-system errors to Status replies a user can act on.

EROFS is a 409 (the target exists but cannot change), EACCES/EPERM a 403,
ENOSPC/EDQUOT a 507; ELOOP/EXDEV mean openat2 refused a symlink, a magic link
or an escape, which is the caller's fault: 400.
"""

from __future__ import annotations

import errno

from aggapi.status import StatusError

_CODES: dict[int, tuple[int, str]] = {
    errno.ENOENT: (404, "no such file or directory"),
    errno.ENOTDIR: (409, "a path component is not a directory"),
    errno.EISDIR: (409, "is a directory"),
    errno.EEXIST: (409, "already exists"),
    errno.ENOTEMPTY: (409, "directory not empty"),
    errno.EROFS: (409, "read-only file system"),
    errno.ETXTBSY: (409, "text file busy"),
    errno.EACCES: (403, "permission denied"),
    errno.EPERM: (403, "operation not permitted"),
    errno.ENOSPC: (507, "no space left on device"),
    errno.EDQUOT: (507, "disk quota exceeded"),
    errno.EFBIG: (413, "file too large for the target file system"),
    errno.ELOOP: (400, "path crosses a symlink or /proc magic link that is not allowed here"),
    errno.EXDEV: (400, "path escapes its root"),
    errno.ENAMETOOLONG: (400, "name too long"),
    errno.EINVAL: (400, "invalid path"),
    errno.EAGAIN: (503, "path kept changing while being resolved; retry"),
}


def fs_status(exc: OSError, path: str) -> StatusError:
    """A StatusError for an OSError met while working on container path ``path``."""
    code, text = _CODES.get(exc.errno or 0, (500, exc.strerror or "file system error"))
    return StatusError(code, f"{path}: {text}",
                       details={"name": path, "causes": [{"reason": errno.errorcode.get(
                           exc.errno or 0, "EIO"), "message": str(exc.strerror or exc)}]})
