"""The bytes containerd has received over TCP: a finer signal than its ingests' steps.

containerd 2.x shows a download's offset in 1 MiB steps (its copy buffer), so a pull on
a slow link shows nothing for its first seconds: with six layers sharing 400 kB/s, 15 s
before the first step. The kernel counts every byte each TCP connection received
(``tcp_info.tcpi_bytes_received``, read with a sock_diag netlink query, as ``ss -ti``
does), at any moment. containerd's connections are found by their socket inodes in
``/proc/<pid>/fd``; its pid from its unix socket's peer credentials (the agent runs with
hostPID). Connections where containerd is the server (its CRI streaming port) are left
out: what remains is what it fetches, i.e. registry bytes (with their HTTP and TLS
framing, well under 1%).

The query must be made in containerd's network namespace: an agent pod has its own, so
the netlink socket is opened in containerd's (``setns`` on a short-lived thread of its
own, which needs CAP_SYS_ADMIN: the agent is privileged). Anything missing (no
permission, no such pid, an old kernel) gives None: the engine then times by the steps
alone, as before.

Cost per read: one netlink round trip (a few hundred bytes per connection on the node's
namespace) and a readlink per open fd of containerd.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCP_ESTABLISHED, TCP_LISTEN = 1, 10
CLONE_NEWNET = 0x40000000
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid (48 bytes)
DIAG_REQ = struct.Struct("=BBBBI48x")
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport (network order),
# src[16], dst[16], if, cookie[2]; expires, rqueue, wqueue, uid, inode
DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
RTA_HDR = struct.Struct("=HH")
TCPI_BYTES_RECEIVED = 128  # offset of the u64 in struct tcp_info (Linux >= 4.1)


@dataclass(frozen=True)
class SockStat:
    inode: int
    state: int
    local_port: int
    bytes_received: int | None  # None: the kernel gave no tcp_info


def diag_request(family: int, states: int, seq: int = 1) -> bytes:
    """A dump request for every TCP socket of ``family`` in ``states`` (a bit mask of
    1 << state), with their tcp_info."""
    body = DIAG_REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, states)
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                          NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_diag(data: bytes) -> tuple[list[SockStat], bool]:
    """The sockets in one netlink read, and whether the dump ended (DONE or an error)."""
    out: list[SockStat] = []
    off = 0
    while off + NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size or off + length > len(data):
            return out, True  # malformed: stop rather than misread
        if kind in (NLMSG_DONE, NLMSG_ERROR):
            return out, True
        body = off + NLMSG_HDR.size
        if kind == SOCK_DIAG_BY_FAMILY and length - NLMSG_HDR.size >= DIAG_MSG.size:
            f = DIAG_MSG.unpack_from(data, body)
            state, sport, inode = f[1], int.from_bytes(f[4], "big"), f[14]
            received = None
            a = body + DIAG_MSG.size
            end = off + length
            while a + RTA_HDR.size <= end:
                alen, atype = RTA_HDR.unpack_from(data, a)
                if alen < RTA_HDR.size:
                    break
                payload = a + RTA_HDR.size
                if atype == INET_DIAG_INFO and alen - RTA_HDR.size >= TCPI_BYTES_RECEIVED + 8:
                    received = int.from_bytes(
                        data[payload + TCPI_BYTES_RECEIVED:payload + TCPI_BYTES_RECEIVED + 8],
                        sys.byteorder)
                a += (alen + 3) & ~3
            out.append(SockStat(inode, state, sport, received))
        off += (length + 3) & ~3
    return out, False


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


def socket_inodes(pid: int, proc: str = "/proc") -> set[int]:
    """The inodes of the sockets process ``pid`` has open."""
    out: set[int] = set()
    fd_dir = f"{proc}/{pid}/fd"
    for name in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            link = os.readlink(f"{fd_dir}/{name}")
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    return out


def _open_diag_socket(pid: int) -> socket.socket:
    """A sock_diag netlink socket in ``pid``'s network namespace (a socket keeps the
    namespace it was made in)."""
    mine = os.stat("/proc/self/ns/net").st_ino
    theirs = os.stat(f"/proc/{pid}/ns/net").st_ino
    if mine == theirs:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        # A thread of its own: setns changes only the calling thread's namespace, and
        # this one ends after moving back (or failing to).
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net",
                      os.O_RDONLY)
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into containerd's netns")
            try:
                result.append(socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                            NETLINK_SOCK_DIAG))
            finally:
                libc.setns(own, CLONE_NEWNET)
        except BaseException as e:  # handed to the caller
            result.append(e)
        finally:
            os.close(own)
            os.close(target)

    t = threading.Thread(target=inside, name="aggapi-netns", daemon=True)
    t.start()
    t.join()
    got = result[0] if result else OSError("no result from the netns thread")
    if isinstance(got, BaseException):
        raise got
    return got


def dump(sock: socket.socket, states: int) -> Iterator[SockStat]:
    """Every TCP socket (IPv4 and IPv6) in ``states`` in the socket's namespace."""
    for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
        sock.send(diag_request(family, states, seq))
        while True:
            stats, done = parse_diag(sock.recv(1 << 16))
            yield from stats
            if done:
                break


class SocketBytes:
    """A monotonic count of the bytes containerd received on its outgoing TCP
    connections: each connection's growth since the previous read (a new one counts
    whole). Bytes of a connection that closed between two reads are lost (at most what
    arrived in one poll interval on it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._pid: int | None = None
        self._sock: socket.socket | None = None
        self._seen: dict[int, int] = {}
        self._total = 0
        self._primed = False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._pid = None, None

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
            self._sock = _open_diag_socket(self._pid)
            self._primed = False
        assert self._sock is not None
        mine = socket_inodes(self._pid)
        stats = [s for s in dump(self._sock, (1 << TCP_ESTABLISHED) | (1 << TCP_LISTEN))
                 if s.inode in mine]
        return self.update(stats)

    def update(self, stats: Iterable[SockStat]) -> int | None:
        """Fold one read of containerd's sockets into the count."""
        stats = list(stats)
        serving = {s.local_port for s in stats if s.state == TCP_LISTEN}
        now: dict[int, int] = {}
        for s in stats:
            if s.state == TCP_ESTABLISHED and s.local_port not in serving \
                    and s.bytes_received is not None:
                now[s.inode] = s.bytes_received
        if self._primed:
            for inode, n in now.items():
                self._total += max(n - self._seen.get(inode, 0), 0)
        self._seen, self._primed = now, True
        return self._total
