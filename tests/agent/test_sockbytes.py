"""containerd's received TCP bytes (aggapi.agent.progress.sockbytes), read from the real
kernel: a process serving a unix socket (as containerd serves its API) that fetches over
TCP, in this network namespace and in one of its own (as an agent pod sees a node's
containerd)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggapi.agent.progress.sockbytes import (
    SocketBytes,
    bytes_received,
    fetching,
    parse_tcp_table,
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


READER = textwrap.dedent("""
    import sys
    from aggapi.agent.progress.sockbytes import SocketBytes
    counter = SocketBytes(sys.argv[1])
    for _ in sys.stdin:  # one read per line
        print(counter.read(), flush=True)
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                    or not shutil.which("setpriv"),
                    reason="needs root, unshare and setpriv: a network namespace of its own")
def test_reads_a_process_in_another_network_namespace_with_only_sys_ptrace(
        tmp_path: Path) -> None:
    """As the agent pod reads the node's containerd: from another network namespace,
    with only the capability the chart gives the agent for this (SYS_PTRACE), through
    the other process's own /proc tables and descriptors."""
    sock = tmp_path / "api.sock"
    child = subprocess.Popen(["unshare", "-n", sys.executable, "-c", NETNS_CHILD, str(sock)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reader = subprocess.Popen(["setpriv", "--bounding-set=-all,+sys_ptrace", "--inh-caps=-all",
                               sys.executable, "-c", READER, str(sock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        assert child.stdout is not None and child.stdin is not None
        assert reader.stdout is not None and reader.stdin is not None
        assert child.stdout.readline().strip() == "ready"

        def count() -> int:
            assert reader.stdin is not None and reader.stdout is not None
            reader.stdin.write("\n")
            reader.stdin.flush()
            return int(reader.stdout.readline())

        before = count()
        for n in (1_000_000, 250_000):
            child.stdin.write(f"{n}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
        assert count() == before + 1_250_000
    finally:
        for p in (child, reader):
            p.kill()
            p.wait()


TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12 1 0
   2: 0100007F:C351 0100007F:01BB 01 00000000:00000000 00:00000000 00000000     0        0 13 1 0
   3: 0100007F:C352 0100007F:01BB 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0
   4: garbage
"""


def test_the_connections_it_opened_not_those_it_serves() -> None:
    """8080 listens: the connection on it is served (inode 12); 13 is a fetch; the one
    in TIME_WAIT has no socket any more (inode 0)."""
    table = parse_tcp_table(TABLE)
    assert [s.inode for s in table] == [11, 12, 13, 0]
    assert fetching(table) == {13}


@given(st.text(max_size=2000))
def test_any_table_parses_without_error(text: str) -> None:
    """The table is read, never trusted to be well formed."""
    parse_tcp_table(text)


def test_tcp_info_too_short_says_nothing() -> None:
    assert bytes_received(b"\0" * 100) is None
    info = bytearray(232)
    info[128:136] = (5 << 32).to_bytes(8, sys.byteorder)
    assert bytes_received(bytes(info)) == 5 << 32


@given(st.lists(st.dictionaries(st.integers(1, 6), st.integers(0, 1 << 40), max_size=6),
                min_size=1, max_size=12))
def test_the_count_never_falls_and_counts_each_new_byte_once(reads: list[dict[int, int]]
                                                            ) -> None:
    """Connections come, grow and go (inodes reused): the count only grows, by each
    connection's growth since the previous read (a new one whole; the first read only
    sets where counting starts)."""
    counter = SocketBytes("unused")
    last: dict[int, int] = {}
    total = before = 0
    for k, read in enumerate(reads):
        got = counter.update(dict(read))
        if k:
            total += sum(max(n - last.get(i, 0), 0) for i, n in read.items())
        last = read
        assert got == total and got >= before
        before = got
