"""Per-thread file-system credentials: a copy acts as the container's user.

Linux keeps credentials per thread. ``setfsuid``/``setfsgid`` (glibc calls the
syscall directly) and the raw ``setgroups`` syscall change only the calling
thread; glibc's ``setgroups()`` wrapper would change every thread of the agent
(its setxid broadcast), so it is never used. A non-zero fsuid also drops the
file-system capabilities (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER, ...), but not
the others: CAP_SYS_RESOURCE would let the user's writes ignore disk quotas and
the blocks ext4 reserves for root. So while acting as a non-root user the thread
also clears its whole effective capability set (``capset`` on the thread; the
permitted set stays, so it can be raised again), and the kernel checks
permissions and limits as that user, as for ``kubectl exec`` of a non-root
process.

:func:`acting_as` switches a worker thread for one operation (ids, then
capabilities) and switches it back in a ``finally`` (capabilities, then ids),
verifying every step (setfsuid never reports failure:
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

# capget/capset (glibc exports both; pid 0 is the calling thread).
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_capget = _libc.capget
_capget.argtypes = [ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData)]
_capget.restype = ctypes.c_int
_capset = _libc.capset
_capset.argtypes = [ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData)]
_capset.restype = ctypes.c_int


def _capdata() -> tuple[_CapHeader, ctypes.Array[_CapData]]:
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _capget(ctypes.byref(hdr), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capget: {os.strerror(err)}")
    return hdr, data


def effective_caps() -> int:
    """This thread's effective capability set (64-bit mask)."""
    _, data = _capdata()
    return data[0].effective | data[1].effective << 32


def set_effective_caps(mask: int) -> None:
    """Set this thread's effective capabilities (a subset of its permitted set) and
    check it took."""
    hdr, data = _capdata()
    data[0].effective = mask & 0xFFFFFFFF
    data[1].effective = mask >> 32 & 0xFFFFFFFF
    if _capset(ctypes.byref(hdr), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    if effective_caps() != mask:
        raise OSError(errno.EPERM, f"capset did not take: wanted {mask:#x}")


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
    caps: int = 0  # effective capabilities before the outermost scope
    dropped = False  # effective capabilities cleared (acting as a non-root user)
    poisoned = False


def _caps_up(st: _ThreadState) -> None:
    if st.dropped:
        set_effective_caps(st.caps)
        st.dropped = False


def _caps_down(st: _ThreadState) -> None:
    if not st.dropped:
        set_effective_caps(0)
        st.dropped = True


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
    prev_dropped = st.dropped
    if st.depth == 0:
        st.baseline = prev
        st.caps = effective_caps()
    st.depth += 1
    try:
        if prev != c or st.dropped == c.privileged:
            try:
                _caps_up(st)  # setgroups and setfsuid need CAP_SETGID/CAP_SETUID
                if prev != c:
                    apply(c)
                if not c.privileged:
                    _caps_down(st)
            except OSError as exc:  # the agent's fault, not the caller's: not a 403
                log.error("cannot act as %s: %s", c, exc)
                raise StatusError(500, "cannot switch to the container user's "
                                  "credentials") from exc
        yield
    finally:
        st.depth -= 1
        try:
            if st.dropped != prev_dropped or Creds.current() != prev:
                _caps_up(st)
                if Creds.current() != prev:
                    apply(prev)
                if prev_dropped:
                    _caps_down(st)
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
