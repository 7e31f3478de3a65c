"""containerd's received TCP bytes (aggapi.agent.progress.sockbytes), read from the real
kernel: a process serving a unix socket (as containerd serves its API) that fetches over
TCP, in this network namespace and in one of its own (as an agent pod sees a node's
containerd)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggapi.agent.progress import sockbytes
from aggapi.agent.progress.sockbytes import (
    TCP_ESTABLISHED,
    TCP_LISTEN,
    SocketBytes,
    SockStat,
    parse_diag,
)


def _transfer(n: int, back: int) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A loopback connection in this process: the client receives ``n`` bytes (an
    outgoing fetch), the server side receives ``back`` (a connection it serves)."""
    srv = socket.create_server(("127.0.0.1", 0))
    cl = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    sender = threading.Thread(target=conn.sendall, args=(b"x" * n,))
    sender.start()
    got = 0
    while got < n:
        got += len(cl.recv(1 << 16))
    sender.join()
    cl.sendall(b"y" * back)
    got = 0
    while got < back:
        got += len(conn.recv(1 << 16))
    return srv, cl, conn


def test_counts_what_this_process_fetched_not_what_it_served(tmp_path: Path) -> None:
    """The process behind the unix socket (this one) fetched 3 MB and served 200 kB:
    the count grows by the 3 MB exactly (the served bytes arrive on a connection of
    its listening port)."""
    api = socket.socket(socket.AF_UNIX)
    api.bind(str(tmp_path / "api.sock"))
    api.listen()
    counter = SocketBytes(f"unix://{tmp_path / 'api.sock'}")
    try:
        before = counter.read()
        assert before is not None
        socks = _transfer(3_000_000, 200_000)
        after = counter.read()
        assert after is not None and after - before == 3_000_000
        assert counter.read() == after  # nothing new: no growth
    finally:
        counter.close()
        api.close()
        for s in locals().get("socks", ()):
            s.close()


def test_nobody_behind_the_socket_gives_none(tmp_path: Path) -> None:
    assert SocketBytes(str(tmp_path / "missing.sock")).read() is None


NETNS_CHILD = textwrap.dedent("""
    import socket, subprocess, sys, threading
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    api = socket.socket(socket.AF_UNIX); api.bind(sys.argv[1]); api.listen()
    srv = socket.create_server(("127.0.0.1", 0))
    cl = socket.create_connection(srv.getsockname()); conn, _ = srv.accept()
    print("ready", flush=True)
    for line in sys.stdin:  # one line per transfer of that many bytes
        n = int(line)
        threading.Thread(target=conn.sendall, args=(b"x" * n,)).start()
        got = 0
        while got < n:
            got += len(cl.recv(1 << 16))
        print("done", flush=True)
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare: a network namespace of its own")
def test_reads_a_process_in_another_network_namespace(tmp_path: Path) -> None:
    """As the agent pod reads the node's containerd: the query is made in the other
    process's namespace (here its fetches are invisible from this one)."""
    sock = tmp_path / "api.sock"
    child = subprocess.Popen(["unshare", "-n", sys.executable, "-c", NETNS_CHILD, str(sock)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    counter = SocketBytes(str(sock))
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        before = counter.read()
        assert before is not None
        for n in (1_000_000, 250_000):
            child.stdin.write(f"{n}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
        assert counter.read() == before + 1_250_000
        assert not [t for t in threading.enumerate() if t.name == "aggapi-netns"]
    finally:
        counter.close()
        child.kill()
        child.wait()


def _msg(inode: int, state: int, port: int, received: int | None) -> bytes:
    body = struct.pack("=BBBB", socket.AF_INET, state, 0, 0) + port.to_bytes(2, "big") \
        + b"\0" * 2 + b"\0" * 32 + b"\0" * 4 + b"\0" * 8 + struct.pack("=IIIII", 0, 0, 0, 0,
                                                                           inode)
    if received is not None:
        info = bytearray(sockbytes.TCPI_BYTES_RECEIVED + 16)
        info[sockbytes.TCPI_BYTES_RECEIVED:sockbytes.TCPI_BYTES_RECEIVED + 8] = \
            received.to_bytes(8, sys.byteorder)
        body += struct.pack("=HH", 4 + len(info), sockbytes.INET_DIAG_INFO) + bytes(info)
    return sockbytes.NLMSG_HDR.pack(16 + len(body), sockbytes.SOCK_DIAG_BY_FAMILY, 2, 1,
                                    0) + body


def test_parses_sockets_and_stops_at_done() -> None:
    done = sockbytes.NLMSG_HDR.pack(20, sockbytes.NLMSG_DONE, 2, 1, 0) + b"\0" * 4
    stats, ended = parse_diag(_msg(7, TCP_ESTABLISHED, 443, 5 << 32) + _msg(8, TCP_LISTEN,
                                                                           80, None) + done)
    assert ended
    assert stats == [SockStat(7, TCP_ESTABLISHED, 443, 5 << 32), SockStat(8, TCP_LISTEN, 80,
                                                                           None)]


@given(st.binary(max_size=2048))
def test_any_reply_parses_without_error(data: bytes) -> None:
    """A reply is never trusted to be well formed: bounded work, no exception."""
    stats, _ = parse_diag(data)
    assert len(stats) <= len(data) // 16


# One read: each connection as (id, bytes received so far, a served one).
Read = list[tuple[int, int, bool]]


@given(st.lists(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 1 << 40), st.booleans()),
                         max_size=6, unique_by=lambda x: x[0]), min_size=1, max_size=12))
def test_the_count_never_falls_and_counts_each_new_byte_once(reads: list[Read]) -> None:
    """Connections come, grow and go (ids reused, as inodes are): the count only grows,
    by each outgoing connection's growth since the previous read (a new one whole), and
    never counts a served connection."""
    counter = SocketBytes("unused")
    last: dict[int, int] = {}
    total, primed = 0, False
    for read in reads:
        stats = [SockStat(i, TCP_ESTABLISHED, 8080 if served else 40000 + i, n)
                 for i, n, served in read]
        stats.append(SockStat(99, TCP_LISTEN, 8080, 0))
        got = counter.update(stats)
        now = {i: n for i, n, served in read if not served}
        if primed:
            total += sum(max(n - last.get(i, 0), 0) for i, n in now.items())
        last, primed = now, True
        assert got == total
