"""What the relay's memory-BIO TLS costs: a TLS relay between a bare blocking TLS sender
and receiver (benchmarks.tls_floor's sides), each its own process over 127.0.0.1, in
the relay's CPU-seconds per GiB, two ways:

    uvloop    uvloop's TLS transports (``ssl.SSLObject`` over memory BIOs), bytes
              decrypted into our own buffers (a BufferedProtocol, as the relay's
              BodyReceiver) and handed to the outgoing transport's ``write``: the
              relay's data path today
    blocking  one thread, ``SSLSocket.recv_into`` then ``sendall``: OpenSSL reads and
              writes the sockets itself (no BIO copies), what issue 27's design change
              "bulk bytes on blocking SSLSockets in worker threads" would do

And a bare agent, the same two ways: a process that reads a file (``pread`` into a
fresh buffer, in a worker thread on uvloop as the agent does), hashes it (sha256) and
sends it over TLS to the blocking receiver.

Run: ``python3 -m benchmarks.relay_floor [--size-mib 1024] [--chunk-kib 1024] [--dir
/dev/shm]`` (the agent's file is made in ``--dir``). No cluster, no lock; prints the
figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.tls_floor import GiB, MiB, _certs, _client_ctx, _cpu, _server_ctx

HIGH = 4 * MiB  # outgoing backlog past which the relay stops reading


class _Down(asyncio.BufferedProtocol):
    """The sender's side: decrypted into fresh buffers, each piece written upstream."""

    def __init__(self, up: asyncio.StreamWriter, size: int, chunk: int,
                 done: asyncio.Future[None]) -> None:
        self.writer, self.up = up, up.transport
        self.left, self.chunk, self.done = size, chunk, done
        self.buf = memoryview(bytearray(chunk))
        self.filled = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.filled == len(self.buf):  # never overwrite what the upstream may hold
            self.buf, self.filled = memoryview(bytearray(self.chunk)), 0
        return self.buf[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self.up.write(self.buf[self.filled:self.filled + nbytes])
        self.filled += nbytes
        self.left -= nbytes
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)
        elif self.up.get_write_buffer_size() > HIGH and self.transport is not None:
            self.transport.pause_reading()
            asyncio.get_running_loop().create_task(self._resume())

    async def _resume(self) -> None:
        await self.writer.drain()  # under the transport's low-water mark
        if self.transport is not None:
            self.transport.resume_reading()


async def _uvloop_relay(d: Path, port_file: Path, up_port: int, size: int,
                        chunk: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    up_r, up_w = await asyncio.open_connection("127.0.0.1", up_port, ssl=_client_ctx(d),
                                               server_hostname="localhost")
    done: asyncio.Future[None] = loop.create_future()
    protos: list[_Down] = []

    def factory() -> _Down:
        protos.append(_Down(up_w, size, chunk, done))
        return protos[-1]
    srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=_server_ctx(d))
    await asyncio.to_thread(port_file.write_text, str(srv.sockets[0].getsockname()[1]))
    await loop.run_in_executor(None, _wait_connected, protos)
    cpu0 = _cpu()
    await done
    ack = await up_r.readexactly(1)  # the receiver has it all: pass its ack back
    assert protos[0].transport is not None
    protos[0].transport.write(ack)
    await asyncio.sleep(0.05)
    cpu = _cpu() - cpu0
    srv.close()
    return {"cpu": cpu}


def _wait_connected(protos: list[_Down]) -> None:
    while not protos:
        time.sleep(0.001)


def _blocking_relay(d: Path, port_file: Path, up_port: int, size: int,
                    chunk: int) -> dict[str, Any]:
    raw_up = socket.create_connection(("127.0.0.1", up_port))
    up = _client_ctx(d).wrap_socket(raw_up, server_hostname="localhost")
    with socket.create_server(("127.0.0.1", 0)) as ls:
        port_file.write_text(str(ls.getsockname()[1]))
        conn, _ = ls.accept()
    cpu0 = _cpu()
    with _server_ctx(d).wrap_socket(conn, server_side=True) as down, up:
        buf = memoryview(bytearray(chunk))
        n = 0
        while n < size and (got := down.recv_into(buf)):
            up.sendall(buf[:got])
            n += got
        down.sendall(up.recv(1))
    return {"cpu": _cpu() - cpu0}


def _read_hashed(fd: int, off: int, n: int, h: Any) -> memoryview:
    buf = bytearray(n)  # fresh: the transport may still hold the previous one
    got = os.preadv(fd, [buf], off)
    view = memoryview(buf)[:got]
    h.update(view)
    return view


async def _uvloop_agent(d: Path, path: Path, up_port: int, size: int,
                        chunk: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    r, w = await asyncio.open_connection("127.0.0.1", up_port, ssl=_client_ctx(d),
                                         server_hostname="localhost")
    fd = os.open(path, os.O_RDONLY)
    h = hashlib.sha256()
    cpu0 = _cpu()
    off = 0
    while off < size:
        view = await loop.run_in_executor(None, _read_hashed, fd, off,
                                          min(chunk, size - off), h)
        w.write(view)
        off += len(view)
        await w.drain()
    await r.readexactly(1)
    os.close(fd)
    return {"cpu": _cpu() - cpu0, "sha256": h.hexdigest()}


def _blocking_agent(d: Path, path: Path, up_port: int, size: int,
                    chunk: int) -> dict[str, Any]:
    raw = socket.create_connection(("127.0.0.1", up_port))
    fd = os.open(path, os.O_RDONLY)
    h = hashlib.sha256()
    cpu0 = _cpu()
    with _client_ctx(d).wrap_socket(raw, server_hostname="localhost") as s:
        buf = memoryview(bytearray(chunk))
        off = 0
        while off < size and (got := os.preadv(fd, [buf[:min(chunk, size - off)]], off)):
            h.update(buf[:got])
            s.sendall(buf[:got])
            off += got
        s.recv(1)
    os.close(fd)
    return {"cpu": _cpu() - cpu0, "sha256": h.hexdigest()}


def _relay_side(argv: list[str]) -> None:
    mode, d, port_file, up_port, size, chunk = argv
    args = (Path(d), Path(port_file), int(up_port), int(size), int(chunk))
    if mode.startswith("agent"):  # port_file is the file to send
        if mode == "agent-uvloop":
            import uvloop

            out = uvloop.run(_uvloop_agent(*args))
        else:
            out = _blocking_agent(*args)
    elif mode == "uvloop":
        import uvloop

        out = uvloop.run(_uvloop_relay(*args))
    else:
        out = _blocking_relay(*args)
    print(json.dumps(out))


def _port(p: Path, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 20
    while not (p.exists() and p.read_text()):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"relay_floor: {p.name} never came")
        time.sleep(0.02)
    return p.read_text()


def relay(mode: str, size: int, chunk: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="relay-floor-") as td:
        d = Path(td)
        _certs(d)
        recv = subprocess.Popen([sys.executable, "-m", "benchmarks.tls_floor", "--side",
                                 "blocking", "recv", str(d), str(d / "recv"), str(size),
                                 str(chunk)], stdout=subprocess.PIPE, text=True)
        rel = subprocess.Popen([sys.executable, "-m", "benchmarks.relay_floor", "--side", mode,
                                str(d), str(d / "relay"), _port(d / "recv", recv), str(size),
                                str(chunk)], stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        send = subprocess.run([sys.executable, "-m", "benchmarks.tls_floor", "--side",
                               "blocking", "send", str(d), _port(d / "relay", rel), str(size),
                               str(chunk)], capture_output=True, text=True, check=True)
        out_rel, _ = rel.communicate(timeout=300)
        out_recv, _ = recv.communicate(timeout=60)
        took = time.monotonic() - t0
        r = json.loads(out_recv)
        if r["bytes"] != size:
            raise SystemExit(f"relay_floor: received {r['bytes']} of {size} bytes")
        gib = size / GiB
        return {"relay": round(json.loads(out_rel)["cpu"] / gib, 3),
                "receiver": round(r["cpu"] / gib, 3),
                "sender": round(json.loads(send.stdout)["cpu"] / gib, 3),
                "MiB_per_s": round(size / MiB / took, 1)}


def agent(mode: str, size: int, chunk: int, where: Path) -> dict[str, float]:
    """The bare agent ``mode`` (uvloop, blocking) sending a file of ``size`` random bytes
    made in ``where``; its sha256 is checked against the file's."""
    with tempfile.TemporaryDirectory(prefix="relay-floor-") as td, \
            tempfile.NamedTemporaryFile(dir=where, prefix="relay-floor-") as f:
        d = Path(td)
        _certs(d)
        want = hashlib.sha256()
        for off in range(0, size, MiB):
            block = os.urandom(min(MiB, size - off))
            f.write(block)
            want.update(block)
        f.flush()
        recv = subprocess.Popen([sys.executable, "-m", "benchmarks.tls_floor", "--side",
                                 "blocking", "recv", str(d), str(d / "recv"), str(size),
                                 str(chunk)], stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        snd = subprocess.run([sys.executable, "-m", "benchmarks.relay_floor", "--side",
                              f"agent-{mode}", str(d), f.name, _port(d / "recv", recv),
                              str(size), str(chunk)], capture_output=True, text=True,
                             check=True)
        out_recv, _ = recv.communicate(timeout=60)
        took = time.monotonic() - t0
        r, a = json.loads(out_recv), json.loads(snd.stdout)
        if r["bytes"] != size or a["sha256"] != want.hexdigest():
            raise SystemExit(f"relay_floor: agent {mode}: {r['bytes']} of {size} bytes, "
                             f"sha256 {'ok' if a['sha256'] == want.hexdigest() else 'wrong'}")
        gib = size / GiB
        return {"agent": round(a["cpu"] / gib, 3), "receiver": round(r["cpu"] / gib, 3),
                "MiB_per_s": round(size / MiB / took, 1)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--side"]:
        _relay_side(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--chunk-kib", type=int, default=1024)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm"),
                    help="where the bare agent's file is made")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    size, chunk = a.size_mib * MiB, a.chunk_kib * 1024
    out = {m: relay(m, size, chunk) for m in ("uvloop", "blocking")}
    agents = {m: agent(m, size, chunk, a.dir) for m in ("uvloop", "blocking")}
    if a.json:
        print(json.dumps({"relay": out, "agent": agents}))
        return 0
    print(f"TLS relay (Python {sys.version.split()[0]}), CPU-s/GiB, relay between a "
          "blocking sender and receiver:")
    for m, r in out.items():
        print(f"  {m:9s} relay {r['relay']:.2f}  (receiver {r['receiver']:.2f}, sender "
              f"{r['sender']:.2f}, {r['MiB_per_s']:.0f} MiB/s)")
    print("bare agent (pread + sha256 + TLS send to a blocking receiver), CPU-s/GiB:")
    for m, r in agents.items():
        print(f"  {m:9s} agent {r['agent']:.2f}  (receiver {r['receiver']:.2f}, "
              f"{r['MiB_per_s']:.0f} MiB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
