"""The floor of Python TLS on this machine: a bare TLS sender and receiver, each its own
process, moving bytes over 127.0.0.1, in CPU-seconds per GiB per side.

Issue 27 asks the relay and the agent to come within 1.2x of such a pair measured in
the same run. Two ways of moving the bytes, side by side:

    asyncio   asyncio streams over the event loop's memory-BIO TLS (what aiohttp does:
              every record goes through an SSLObject and a Python-level buffer)
    blocking  a blocking ``SSLSocket`` (OpenSSL reads and writes the socket itself,
              without the GIL held)

The relay decrypts and encrypts every byte (a receiver plus a sender); the agent
decrypts it (a receiver) and then writes and hashes it.

Run: ``python3 -m benchmarks.tls_floor [--size-mib 512] [--chunk-kib 1024] [--image
IMAGE] [--json]``. No cluster, no lock needed; prints the figures, asserts nothing.
``--image`` runs the pair inside an image of hack/build-image.sh (``buildah run``, this
checkout's benchmarks/ mounted: the image holds no benchmark), on the image's Python and
OpenSSL, which the pods run. Used by ``bench_kubectl_cp --installed``, which prints it
beside the pods' figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aggapi.tls import pki

MiB = 1 << 20
GiB = 1 << 30


def _server_ctx(d: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "tls.crt", d / "tls.key")
    return ctx


def _client_ctx(d: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(d / "ca.crt")
    return ctx


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --- the two sides, each run as its own process ------------------------------------

async def _async_recv(d: Path, port_file: Path, size: int, chunk: int) -> dict[str, Any]:
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        n = 0
        while n < size and (data := await r.read(chunk)):
            n += len(data)
        w.write(b"k")  # all received: the sender may close (a close may drop data)
        await w.drain()
        w.close()
        done.set_result(n)

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=_server_ctx(d), limit=2 * chunk)
    await asyncio.to_thread(port_file.write_text, str(srv.sockets[0].getsockname()[1]))
    cpu0 = _cpu()
    n = await done
    srv.close()
    return {"bytes": n, "cpu": _cpu() - cpu0}


async def _async_send(d: Path, port: int, size: int, chunk: int) -> dict[str, Any]:
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=_client_ctx(d),
                                         server_hostname="localhost")
    block = os.urandom(chunk)
    cpu0 = _cpu()
    left = size
    while left:
        w.write(block[:min(chunk, left)])
        left -= min(chunk, left)
        await w.drain()
    await r.readexactly(1)
    w.close()
    return {"bytes": size, "cpu": _cpu() - cpu0}


def _block_recv(d: Path, port_file: Path, size: int, chunk: int) -> dict[str, Any]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        port_file.write_text(str(ls.getsockname()[1]))
        conn, _ = ls.accept()
        cpu0 = _cpu()
        with _server_ctx(d).wrap_socket(conn, server_side=True) as s:
            buf = bytearray(chunk)
            view = memoryview(buf)
            n = 0
            while n < size and (got := s.recv_into(view)):
                n += got
            s.sendall(b"k")
        return {"bytes": n, "cpu": _cpu() - cpu0}


def _block_send(d: Path, port: int, size: int, chunk: int) -> dict[str, Any]:
    raw = socket.create_connection(("127.0.0.1", port))
    cpu0 = _cpu()
    with _client_ctx(d).wrap_socket(raw, server_hostname="localhost") as s:
        block = memoryview(os.urandom(chunk))
        left = size
        while left:
            s.sendall(block[:min(chunk, left)])
            left -= min(chunk, left)
        s.recv(1)
    return {"bytes": size, "cpu": _cpu() - cpu0}


def _side(argv: list[str]) -> None:
    mode, role, d, arg, size, chunk = argv
    if role == "recv":
        out = (asyncio.run(_async_recv(Path(d), Path(arg), int(size), int(chunk)))
               if mode == "asyncio" else _block_recv(Path(d), Path(arg), int(size), int(chunk)))
    else:
        out = (asyncio.run(_async_send(Path(d), int(arg), int(size), int(chunk)))
               if mode == "asyncio" else _block_send(Path(d), int(arg), int(size), int(chunk)))
    print(json.dumps(out))


# --- the pair ----------------------------------------------------------------------

def _certs(d: Path) -> None:
    ca = pki.new_ca("tls-floor-ca", days=1)
    leaf = pki.issue(ca, "localhost", dns=["localhost"], server=True, days=1)
    (d / "ca.crt").write_bytes(ca.cert_pem)
    leaf.write(d / "tls.crt", d / "tls.key")


def pair(mode: str, size: int, chunk: int) -> dict[str, float]:
    """CPU-s/GiB of the receiver and of the sender, and MiB/s, for one transfer."""
    with tempfile.TemporaryDirectory(prefix="tls-floor-") as td:
        d = Path(td)
        _certs(d)
        port_file = d / "port"
        me = [sys.executable, "-m", "benchmarks.tls_floor", "--side"]
        recv = subprocess.Popen([*me, mode, "recv", str(d), str(port_file), str(size),
                                 str(chunk)], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or recv.poll() is not None:
                raise SystemExit("tls_floor: receiver did not start")
            time.sleep(0.02)
        t0 = time.monotonic()
        send = subprocess.run([*me, mode, "send", str(d), port_file.read_text(), str(size),
                               str(chunk)], capture_output=True, text=True, check=True)
        out_r, _ = recv.communicate(timeout=120)
        took = time.monotonic() - t0
        r, s = json.loads(out_r), json.loads(send.stdout)
        if r["bytes"] != size:
            raise SystemExit(f"tls_floor: received {r['bytes']} of {size} bytes")
        gib = size / GiB
        return {"receiver": round(r["cpu"] / gib, 3), "sender": round(s["cpu"] / gib, 3),
                "MiB_per_s": round(size / MiB / took, 1)}


def floor(size: int = 512 * MiB, chunk: int = MiB) -> dict[str, Any]:
    out: dict[str, Any] = {mode: pair(mode, size, chunk) for mode in ("asyncio", "blocking")}
    out["runtime"] = f"Python {sys.version.split()[0]}, {ssl.OPENSSL_VERSION}"
    return out


def image_argv(container: str, argv: list[str]) -> list[str]:
    """``buildah run`` of this module with ``argv`` in buildah's ``container``: the
    image's interpreter (its venv's, first on its PATH), this checkout's benchmarks/
    mounted read-only beside it, loopback shared (chroot isolation)."""
    bench = Path(__file__).resolve().parent
    return ["buildah", "run", "--isolation", "chroot", "--user", "0:0",
            "--volume", f"{bench}:/opt/bench/benchmarks:ro", "--env", "PYTHONPATH=/opt/bench",
            "--workingdir", "/tmp", container, "--",
            "python3", "-m", "benchmarks.tls_floor", *argv]


def floor_in_image(image: str, size: int = 512 * MiB, chunk: int = MiB) -> dict[str, Any]:
    """:func:`floor` inside a container of ``image`` (buildah's local storage)."""
    ctr = subprocess.run(["buildah", "from", "--pull=never", image], capture_output=True,
                         text=True, check=True).stdout.strip()
    try:
        argv = image_argv(ctr, ["--size-mib", str(size // MiB), "--chunk-kib",
                                str(chunk // 1024), "--json"])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"tls_floor in {image}: {r.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
        out["image"] = image
        return out
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)


def print_floor(f: dict[str, Any]) -> None:
    where = f" in {f['image']}" if "image" in f else ""
    print(f"TLS floor ({f['runtime']}{where}), CPU-s/GiB per side:")
    for mode in ("asyncio", "blocking"):
        m = f[mode]
        print(f"  {mode:9s} receiver {m['receiver']:.2f}  sender {m['sender']:.2f}  "
              f"({m['MiB_per_s']:.0f} MiB/s)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--side"]:
        _side(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.tls_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--chunk-kib", type=int, default=1024)
    p.add_argument("--image", help="run inside this image (buildah's local storage), e.g. "
                   "localhost/aggapi:dev of hack/build-image.sh")
    p.add_argument("--json", action="store_true", help="print one JSON line instead")
    a = p.parse_args(argv)
    size, chunk = a.size_mib * MiB, a.chunk_kib * 1024
    f = floor_in_image(a.image, size, chunk) if a.image else floor(size, chunk)
    if a.json:
        print(json.dumps(f))
    else:
        print_floor(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
