"""The harness's admin access to kube-apiserver: HTTPS requests and kubectl."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from tests.framework.cplayout import ControlPlaneLayout
from tests.framework.kubetools import binary
from tests.framework.procs import HarnessError


class AdminAccess(ControlPlaneLayout):
    def _ssl(self, user: str = "admin") -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        if user == "admin":
            ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return ctx

    def get(self, path: str, *, authenticated: bool = True,
            timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` on kube-apiserver as admin (or with no credentials)."""
        return self.request("GET", path, authenticated=authenticated, timeout=timeout)

    def request(self, method: str, path: str, data: bytes | None = None, *,
                authenticated: bool = True, timeout: float = 5.0) -> tuple[int, bytes]:
        """``method`` ``path`` (with body ``data``) on kube-apiserver as admin (or with no
        credentials): the status and the whole body."""
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        ctx = self._ssl("admin" if authenticated else "none")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def timed_get(self, path: str, *, timeout: float = 5.0) -> tuple[int, float, float, bytes]:
        """GET ``path`` as admin: the status, seconds to the response's head and to its
        last byte, and the body (a server that builds its answer whole before sending
        spends the first; the transfer is the difference)."""
        req = urllib.request.Request(self.server + path)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, context=self._ssl("admin"), timeout=timeout) as r:
                head = time.monotonic() - t0
                body = bytes(r.read())
                return int(r.status), head, time.monotonic() - t0, body
        except urllib.error.HTTPError as e:
            took = time.monotonic() - t0
            return int(e.code), took, took, bytes(e.read())

    def readyz(self) -> bool:
        try:
            return self.get("/readyz", timeout=2)[0] == 200
        except OSError:
            return False

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def kubectl(self, *args: str, user: str | None = None, input: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        kc = self.admin_kubeconfig if user is None else self.user_kubeconfig(user)
        cp = subprocess.run([binary("kubectl"), f"--kubeconfig={kc}", *args], input=input,
                            text=True, capture_output=True, timeout=120)
        if check and cp.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)}: {cp.stderr.strip()}")
        return cp

    def apply(self, objs: Sequence[Mapping[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts",
                     "--field-manager=aggapi-harness", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))
