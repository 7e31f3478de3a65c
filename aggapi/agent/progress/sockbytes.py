"""The bytes containerd has received over TCP: a finer signal than its ingests' steps.

containerd 2.x shows a download's offset in 1 MiB steps (its copy buffer), so a pull on
a slow link shows nothing for its first seconds: with three layers sharing 400 kB/s, 8 s
before the first step. The kernel counts the bytes every TCP connection has received
(``tcp_info.tcpi_bytes_received``), at any moment. The agent reads containerd's:

- its pid from its API socket's peer credentials (the agent runs with hostPID);
- its TCP sockets from ``/proc/<pid>/net/tcp`` and ``tcp6`` (its network namespace,
  whichever that is), by inode; established connections on a port it listens on (its
  CRI streaming server) are left out: what remains is what it fetches, i.e. registry
  bytes (with their HTTP and TLS framing, well under 1%);
- each such socket's file descriptor from ``/proc/<pid>/fd``, copied into the agent with
  ``pidfd_getfd`` (Linux 5.6), asked ``getsockopt(TCP_INFO)`` and closed (closing a copy
  leaves the connection alone).

That needs what the agent already has, CAP_SYS_PTRACE (the same access as opening
``/proc/<pid>/root``), and works whatever the agent's network namespace: no setns, no
CAP_SYS_ADMIN or CAP_NET_ADMIN. Anything missing (no permission, an old kernel, no such
pid) gives None: the engine then times by the steps alone, as before.

Cost per read: two small /proc reads of the namespace's TCP table, a readlink per open fd
of containerd, and three syscalls per registry connection.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

SYS_PIDFD_GETFD = 438  # the same number on every architecture (Linux 5.6)
TCP_ESTABLISHED, TCP_LISTEN = 1, 10
TCP_INFO_LEN = 232
TCPI_BYTES_RECEIVED = 128  # offset of the u64 in struct tcp_info (Linux >= 4.1)
MAX_TABLE = 16 << 20  # bytes read of a /proc/net/tcp table, at most


@dataclass(frozen=True)
class TcpSocket:
    inode: int
    state: int
    local_port: int


def parse_tcp_table(text: str) -> list[TcpSocket]:
    """The sockets of a ``/proc/<pid>/net/tcp`` (or ``tcp6``) table; lines that do not
    parse are skipped."""
    out: list[TcpSocket] = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        try:
            port = int(f[1].rsplit(":", 1)[1], 16)
            out.append(TcpSocket(int(f[9]), int(f[3], 16), port))
        except (ValueError, IndexError):
            continue
    return out


def fetching(table: Iterable[TcpSocket]) -> set[int]:
    """Inodes of the established connections not on a listening port: the ones the
    process opened."""
    table = list(table)
    serving = {s.local_port for s in table if s.state == TCP_LISTEN}
    return {s.inode for s in table if s.state == TCP_ESTABLISHED
            and s.local_port not in serving}


def bytes_received(info: bytes) -> int | None:
    """``tcpi_bytes_received`` of a ``TCP_INFO`` answer (None: too short, an old kernel)."""
    if len(info) < TCPI_BYTES_RECEIVED + 8:
        return None
    return int.from_bytes(info[TCPI_BYTES_RECEIVED:TCPI_BYTES_RECEIVED + 8], sys.byteorder)


def peer_pid(address: str) -> int | None:
    """The pid of the process serving the unix socket at ``address`` (SO_PEERCRED)."""
    path = address.removeprefix("unix://").removeprefix("unix:")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(path)
            pid, _, _ = struct.unpack("3i", s.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return pid or None
    except OSError:
        return None


def socket_fds(pid: int, inodes: set[int], proc: str = "/proc") -> dict[int, int]:
    """inode -> fd of process ``pid``'s descriptors of those sockets."""
    out: dict[int, int] = {}
    fd_dir = f"{proc}/{pid}/fd"
    for name in os.listdir(fd_dir):
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"{fd_dir}/{name}")
            if link.startswith("socket:["):
                inode = int(link[8:-1])
                if inode in inodes:
                    out[inode] = int(name)
    return out


_libc = ctypes.CDLL(None, use_errno=True)


def _received_on(pidfd: int, fd: int) -> int | None:
    """A copy of the process's ``fd``, asked its TCP_INFO, then closed."""
    mine = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
    if mine < 0:
        err = ctypes.get_errno()
        if err in (9, 2):  # EBADF/ENOENT: closed since the fd list was read
            return None
        raise OSError(err, os.strerror(err))
    s = socket.socket(fileno=mine)
    try:
        return bytes_received(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN))
    except OSError:
        return None
    finally:
        s.detach()
        os.close(mine)


class SocketBytes:
    """A monotonic count of the bytes containerd received on its outgoing TCP
    connections: each connection's growth since the previous read (a new one counts
    whole). Bytes of a connection that closed between two reads are lost (at most what
    arrived in one poll interval on it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._seen: dict[int, int] = {}
        self._total = 0
        self._primed = False

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
        self._pidfd = self._pid = None

    def read(self) -> int | None:
        """Blocking (run it off the event loop). None when the count cannot be read."""
        try:
            return self._read()
        except OSError:
            self.close()
            return None

    def _read(self) -> int | None:
        if self._pid is None or not os.path.exists(f"/proc/{self._pid}"):
            self.close()
            self._pid = peer_pid(self.address)
            if self._pid is None:
                return None
            self._pidfd = os.pidfd_open(self._pid)
            self._primed = False
        assert self._pidfd is not None
        table: list[TcpSocket] = []
        for name in ("tcp", "tcp6"):
            with contextlib.suppress(FileNotFoundError), \
                    open(f"/proc/{self._pid}/net/{name}") as f:
                table += parse_tcp_table(f.read(MAX_TABLE))
        now: dict[int, int] = {}
        for inode, fd in socket_fds(self._pid, fetching(table)).items():
            n = _received_on(self._pidfd, fd)
            if n is not None:
                now[inode] = n
        return self.update(now)

    def update(self, now: dict[int, int]) -> int:
        """Fold one read (inode -> bytes received so far) into the count."""
        if self._primed:
            for inode, n in now.items():
                self._total += max(n - self._seen.get(inode, 0), 0)
        self._seen, self._primed = now, True
        return self._total
