"""Per-thread file-system credentials: a copy acts as the container's user.

Linux keeps credentials per thread. ``setfsuid``/``setfsgid`` (glibc calls the
syscall directly) and the raw ``setgroups`` syscall change only the calling
thread; glibc's ``setgroups()`` wrapper would change every thread of the agent
(its setxid broadcast), so it is never used. A non-zero fsuid also drops the
file-system capabilities (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER, ...), so the
kernel checks permissions as that user, exactly as for ``kubectl exec``.

:func:`acting_as` switches a worker thread for one operation and switches it
back in a ``finally``, verifying both steps (setfsuid never reports failure:
it returns the previous value, so a second call reads the current one). A
thread whose restore failed is poisoned: it refuses every later operation
rather than act with the wrong identity. :data:`CURRENT` is the identity of
the copy being served; :class:`aggapi.agent.copy.workers.Workers` wraps each
call in it. :func:`as_agent` steps back to the agent's own identity inside a
scope, for the agent's own files (the in-flight records).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass

from aggapi.status import StatusError

log = logging.getLogger(__name__)

SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159, "arm64": 159}
QUERY = 0xFFFFFFFF  # (uid_t)-1: not a valid id, so setfsuid only reports the current one
NGROUPS_MAX = 65536

_libc = ctypes.CDLL(None, use_errno=True)
_setfsuid = _libc.setfsuid
_setfsuid.argtypes = [ctypes.c_uint32]
_setfsuid.restype = ctypes.c_int
_setfsgid = _libc.setfsgid
_setfsgid.argtypes = [ctypes.c_uint32]
_setfsgid.restype = ctypes.c_int
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


@dataclass(frozen=True)
class Creds:
    """File-system identity in host ids (the agent's user namespace)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @property
    def privileged(self) -> bool:
        """fsuid 0 keeps the file-system capabilities: root semantics."""
        return self.uid == 0

    @classmethod
    def parse_status(cls, text: str) -> Creds:
        """From /proc/<pid>/status: the fs ids (4th of Uid/Gid) and Groups.

        The kernel prints them mapped into the reader's user namespace, so they
        are host ids even for a user-namespaced container."""
        fields: dict[str, list[str]] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                fields[key] = value.split()
        try:
            uid = int(fields["Uid"][3])
            gid = int(fields["Gid"][3])
            groups = tuple(sorted({int(g) for g in fields.get("Groups", [])}))
        except (KeyError, IndexError, ValueError) as exc:
            raise StatusError(500, f"cannot read the container process's credentials: {exc}") \
                from exc
        return cls(uid, gid, groups)

    @classmethod
    def of_pid(cls, pid: int, proc: str = "/proc") -> Creds:
        """Blocking read of a small procfs file: call from a worker thread."""
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            return cls.parse_status(f.read())

    @classmethod
    def current(cls) -> Creds:
        """This thread's fsuid, fsgid and supplementary groups."""
        return cls(_setfsuid(QUERY), _setfsgid(QUERY), tuple(sorted(set(os.getgroups()))))


def _setgroups(groups: tuple[int, ...]) -> None:
    try:
        nr = SYS_SETGROUPS[platform.machine()]
    except KeyError as exc:
        raise OSError(errno.ENOSYS, f"setgroups number unknown on {platform.machine()}") \
            from exc
    if len(groups) > NGROUPS_MAX:
        raise OSError(errno.EINVAL, "too many supplementary groups")
    arr = (ctypes.c_uint32 * max(len(groups), 1))(*groups)
    if _syscall(ctypes.c_long(nr), ctypes.c_size_t(len(groups)), arr) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")


def apply(c: Creds) -> None:
    """Set this thread's identity to ``c`` and check it took (raises OSError if not)."""
    _setgroups(c.groups)
    _setfsgid(c.gid)
    _setfsuid(c.uid)
    now = Creds.current()
    if now != c:
        raise OSError(errno.EPERM, f"credential switch did not take: wanted {c}, have {now}")


class _ThreadState(threading.local):
    depth = 0
    baseline: Creds | None = None  # identity before the outermost scope
    poisoned = False


_state = _ThreadState()


@contextmanager
def acting_as(c: Creds | None) -> Iterator[None]:
    """Run the block as ``c`` on this thread (None: as the agent), then switch back."""
    st = _state
    if st.poisoned:
        raise StatusError(500, "copy worker thread has unknown credentials; refusing")
    if c is None:
        yield
        return
    prev = Creds.current()
    if st.depth == 0:
        st.baseline = prev
    st.depth += 1
    try:
        if prev != c:
            try:
                apply(c)
            except OSError as exc:  # the agent's fault, not the caller's: not a 403
                log.error("cannot act as %s: %s", c, exc)
                raise StatusError(500, "cannot switch to the container user's "
                                  "credentials") from exc
        yield
    finally:
        st.depth -= 1
        try:
            if Creds.current() != prev:
                apply(prev)
        except OSError as exc:
            st.poisoned = True
            log.critical("copy worker %s could not restore its credentials: %s",
                         threading.current_thread().name, exc)
            raise StatusError(500, "copy worker could not restore its credentials") from exc
        if st.depth == 0:
            st.baseline = None


@contextmanager
def as_agent() -> Iterator[None]:
    """Inside :func:`acting_as`, step back to the agent's own identity for the block."""
    with acting_as(_state.baseline):
        yield


def poisoned() -> bool:
    return _state.poisoned


# The identity of the copy this task serves; None acts as the agent (root).
CURRENT: ContextVar[Creds | None] = ContextVar("aggapi_copy_creds", default=None)


def bind(c: Creds | None) -> Token[Creds | None]:
    return CURRENT.set(c)


def unbind(token: Token[Creds | None]) -> None:
    CURRENT.reset(token)


@contextmanager
def serving(c: Creds | None) -> Iterator[None]:
    """Every worker call made by this task in the block acts as ``c``."""
    token = bind(c)
    try:
        yield
    finally:
        unbind(token)
