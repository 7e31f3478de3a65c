"""Tenant A's abuse of copy in the tenant-isolation e2e test (test_tenant_isolation.py):
slowloris uploads, unread downloads, entry floods, abandoned HEADs."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests import tarcraft as tc
from tests.e2e.addon.helpers import MiB
from tests.e2e.addon.tenantapi import Api, _copy

NS_A = "tenant-a"
RATE_WINDOW = 30.0  # the chart's agent.copyRateWindow
FLOOD = b"".join(tc.entry(b"./", typeflag=b"5") for _ in range(100_001)) + tc.ZERO2


@dataclass
class Attack:
    """Tenant A's abuse, each kind in its own threads, with what became of it."""

    api: Api
    stop: threading.Event = field(default_factory=threading.Event)
    stop_flood: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    slow_uploads: list[tuple[int, float]] = field(default_factory=list)  # (status, after s)
    unread: list[int] = field(default_factory=list)  # bytes received in all
    floods: list[tuple[int, float]] = field(default_factory=list)
    flood_errors: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)

    def spawn(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def slow_upload(self, pod: str, n: int) -> None:
        """POST announcing 1 MiB, then 10 B/s: holds a slot until the agent cuts it. Raw
        TLS, so that a reply arriving mid-body is seen (its status line is parsed)."""
        tls = self.api.ctx.wrap_socket(
            socket.create_connection((self.api.host, self.api.port), timeout=30),
            server_hostname=self.api.host)
        t0 = time.monotonic()
        status, reply = -1, b""
        try:
            tls.sendall(f"POST {_copy(NS_A, pod, f'/tmp/slow{n}')} HTTP/1.1\r\n"
                        f"Host: {self.api.host}\r\nContent-Type: application/octet-stream\r\n"
                        f"Content-Length: {MiB}\r\n\r\n".encode())
            tls.settimeout(1.0)
            while not self.stop.is_set() and time.monotonic() - t0 < RATE_WINDOW * 3:
                try:
                    tls.sendall(b"s" * 10)
                    data = tls.recv(4096)  # waits 1 s: the pace of the trickle
                except TimeoutError:
                    continue
                except OSError:
                    break
                reply += data
                if not data or b"\r\n" in reply:
                    break
            first = reply.split(b"\r\n", 1)[0].split()
            if len(first) >= 2 and first[1].isdigit():
                status = int(first[1])
        finally:
            tls.close()
        with self.lock:
            self.slow_uploads.append((status, time.monotonic() - t0))

    def unread_download(self, pod: str) -> None:
        """GET a 512 MiB file and read nothing for RATE_WINDOW + 20 s, so the agent's
        writes wait on full buffers; then drain: a download the agent cut ends short."""
        s = socket.create_connection((self.api.host, self.api.port), timeout=30)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        tls = self.api.ctx.wrap_socket(s, server_hostname=self.api.host)
        got = 0
        try:
            tls.sendall(f"GET {_copy(NS_A, pod, '/tmp/huge')} HTTP/1.1\r\n"
                        f"Host: {self.api.host}\r\nConnection: close\r\n\r\n".encode())
            self.stop.wait(RATE_WINDOW + 20)
            # Drained through a wide window: through the 4 KiB one, what the path had
            # buffered trickled in at ~35 KB/s (zero-window probes), for two minutes.
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            while True:
                try:
                    data = tls.recv(1 << 20)
                except OSError:
                    break
                if not data:
                    break
                got += len(data)
        finally:
            tls.close()
        with self.lock:
            self.unread.append(got)

    def flood(self, pod: str) -> None:
        while not self.stop_flood.is_set():
            t = time.monotonic()
            try:
                status = self.api.post_watching(_copy(NS_A, pod, "/tmp/flood",
                                                      format="tar"), FLOOD)
            except (http.client.HTTPException, OSError) as exc:
                status = -1  # no answer: what the connection said, for the report
                with self.lock:
                    self.flood_errors.append(f"{type(exc).__name__}: {exc}")
            with self.lock:
                self.floods.append((status, time.monotonic() - t))

    def head(self, pod: str) -> None:
        while not self.stop.is_set():
            conn = self.api.connect(timeout=5)
            try:
                conn.request("HEAD", _copy(NS_A, pod, "/tmp/sparse"))
                r = conn.getresponse()
                r.read()
                what = f"{r.status} digest={'Digest' in r.headers}"
            except (http.client.HTTPException, OSError) as exc:
                what = f"abandoned ({type(exc).__name__})"
            finally:
                conn.close()
            with self.lock:
                self.heads.append(what)
            self.stop.wait(0.5)

    def join(self) -> None:
        self.stop.set()
        self.stop_flood.set()
        for t in self.threads:
            t.join(RATE_WINDOW * 3 + 30)
