"""A user's HTTPS requests to kube-apiserver for the tenant-isolation e2e test
(test_tenant_isolation.py), and the path of a pod's copy subresource."""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from tests.e2e.addon.helpers import GV


class Api:
    """One user's HTTPS requests to kube-apiserver (client certificate from their
    kubeconfig), on a kept-alive connection per thread."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        kc = json.loads(kubeconfig.read_text())
        user = kc["users"][0]["user"]
        cluster = kc["clusters"][0]["cluster"]
        u = urlsplit(cluster["server"])
        self.host, self.port = u.hostname or "", u.port or 443
        cert, key = tmp / f"{kubeconfig.stem}.crt", tmp / f"{kubeconfig.stem}.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        self.ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self.ctx.load_cert_chain(cert, key)
        self.local = threading.local()

    def connect(self, timeout: float = 120.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                           timeout=timeout)

    def post_watching(self, target: str, body: bytes, timeout: float = 120.0) -> int:
        """POST ``body`` on a connection of its own, reading while it sends: an answer
        that comes before the body is all sent (a refusal: 429 for a tenant beyond its
        share, or a 413 while the last bytes are still in flight) is read and the rest
        not sent, as kubectl's Go client does. http.client goes on sending into the
        server's close (kube-apiserver closes a connection whose unread body is over
        256 KiB) and sees only a reset. The status."""
        raw = socket.create_connection((self.host, self.port), timeout=timeout)
        sock = self.ctx.wrap_socket(raw, server_hostname=self.host)
        try:
            sock.sendall((f"POST {target} HTTP/1.1\r\nHost: {self.host}\r\n"
                          f"Content-Type: application/octet-stream\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode())
            got, view, off = b"", memoryview(body), 0
            sock.setblocking(False)  # never blocked in a send while the answer waits
            while off < len(body) and not got:
                readable, writable, _ = select.select([sock], [sock], [], timeout)
                if not readable and not writable:
                    raise TimeoutError("no progress sending the body")
                if readable or sock.pending():
                    try:
                        got = sock.recv(65536)
                        if not got:
                            break  # closed: no answer (reported below)
                    except ssl.SSLWantReadError:
                        pass  # a TLS record without data (a session ticket)
                if writable and not got:
                    try:
                        off += sock.send(view[off:off + 65536])
                    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        pass
                    except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
                        break  # the answer may be in the receive buffer still
            sock.settimeout(timeout)
            while b"\r\n" not in got:
                piece = sock.recv(4096)
                if not piece:
                    raise http.client.RemoteDisconnected("closed without an answer")
                got += piece
            return int(got.split(b" ", 2)[1])
        finally:
            sock.close()

    def request(self, method: str, target: str, body: bytes | None = None,
                timeout: float = 120.0) -> tuple[int, bytes, http.client.HTTPResponse]:
        conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
        for attempt in (0, 1):  # a kept-alive connection the server closed: one retry
            if conn is None:
                conn = self.local.conn = self.connect(timeout)
            try:
                conn.request(method, target, body=body, headers={
                    "Content-Type": "application/octet-stream"} if body is not None else {})
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, data, resp
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _copy(ns: str, pod: str, p: str, **q: str) -> str:
    return f"{GV}/namespaces/{ns}/pods/{pod}/copy?" + urlencode(
        {"container": "c", "path": p, **q})
