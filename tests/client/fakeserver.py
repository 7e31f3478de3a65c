"""An in-process HTTPS stand-in for kube-apiserver + aggapi, speaking the documented
wire format of pods/imagepullprogress and pods/copy on the /watch/ paths.

A fake for fast client and plugin tests; the real stack is exercised by tests/e2e.
Auth: a client certificate of its client CA, or a bearer token it knows; user
"mallory" is authenticated but forbidden everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from aggapi.status import StatusError, status_middleware
from aggapi.tls import pki
from tests.client.fakecopy import FakeCopy
from tests.client.fakestate import Pod, Session  # noqa: F401

PREFIX = "/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/{ns}/pods/{pod}"
FORBIDDEN_USER = "mallory"


# The fields are FakeClusterState's (fakestate.py), pods/copy FakeCopy's (fakecopy.py).
class FakeCluster(FakeCopy):
    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> str:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert, key = self.tmp / "srv.crt", self.tmp / "srv.key"
        self.serving.write(cert, key)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(cafile=str(self.ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application(middlewares=[status_middleware, self._auth],
                              client_max_size=1 << 30)
        base = PREFIX
        app.router.add_get(base + "/imagepullprogress", self.progress)
        app.router.add_route("*", base + "/copy", self.copy)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}", self.get_pod)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/{kind}", self.list_workloads)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # --- kubeconfigs ------------------------------------------------------------------
    def kubeconfig(self, user: str = "alice", auth: str = "cert", *, namespace: str = "",
                   exec_tokens: list[str] | None = None) -> Path:
        """A kubeconfig for ``user``: ``cert``, ``token`` or ``exec`` (a script printing
        an ExecCredential; with ``exec_tokens`` it hands them out one per run)."""
        u: dict[str, Any] = {}
        d = self.tmp / f"kc-{user}-{auth}"
        d.mkdir(exist_ok=True)
        if auth == "cert":
            kp = pki.issue(self.ca, user, client=True)
            kp.write(d / "u.crt", d / "u.key")
            u = {"client-certificate": str(d / "u.crt"), "client-key": str(d / "u.key")}
        elif auth == "token":
            tok = f"tok-{user}"
            self.tokens[tok] = user
            u = {"token": tok}
        elif auth == "exec":
            toks = exec_tokens or [f"tok-{user}"]
            for t in toks:
                self.tokens.setdefault(t, user)
            (d / "tokens").write_text("\n".join(toks))
            (d / "runs").write_text("")
            script = d / "cred.py"
            script.write_text(
                "import json, pathlib, sys\n"
                f"d = pathlib.Path({str(d)!r})\n"
                "runs = d.joinpath('runs').read_text().count('x')\n"
                "d.joinpath('runs').write_text('x' * (runs + 1))\n"
                "toks = d.joinpath('tokens').read_text().split()\n"
                "tok = toks[min(runs, len(toks) - 1)]\n"
                "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
                " 'kind': 'ExecCredential', 'status': {'token': tok}}))\n")
            u = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                          "command": sys.executable, "args": [str(script)],
                          "interactiveMode": "Never"}}
        ctx: dict[str, Any] = {"cluster": "fake", "user": user}
        if namespace:
            ctx["namespace"] = namespace
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
               "clusters": [{"name": "fake", "cluster": {
                   "server": self.url, "certificate-authority": str(self.ca_file)}}],
               "users": [{"name": user, "user": u}],
               "contexts": [{"name": "fake", "context": ctx}]}
        path = d / "kubeconfig"
        path.write_text(json.dumps(doc))
        return path

    def exec_runs(self, user: str = "alice") -> int:
        return (self.tmp / f"kc-{user}-exec" / "runs").read_text().count("x")

    # --- middleware -------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = None
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            for rdn in peer.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        user = v
        authz = request.headers.get("Authorization", "")
        if user is None and authz.startswith("Bearer "):
            user = self.tokens.get(authz[7:])
        self.requests.append({"method": request.method, "path": request.path,
                              "query": list(request.query.items()), "user": user,
                              "headers": dict(request.headers),
                              "header_items": list(request.headers.items())})
        if user is None:
            raise StatusError(401, "Unauthorized")
        ns, pod = request.match_info.get("ns", ""), request.match_info.get("pod", "")
        sub = request.path.rsplit("/", 1)[-1]
        if user == FORBIDDEN_USER:
            raise StatusError(403, f'pods "{pod}" is forbidden: User "{user}" cannot watch '
                                   f'resource "pods/{sub}" in API group '
                                   f'"subresources.aggapi.io" in the namespace "{ns}"')
        if pod and (ns, pod) not in self.pods:
            raise StatusError(404, f'pods "{pod}" not found')
        return await handler(request)

    # --- core API (what completion and container defaulting read) ---------------------
    async def list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": [
            p.manifest(n, name) for (n, name), p in sorted(self.pods.items()) if n == ns]})

    async def get_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["pod"]
        return web.json_response(self.pods[(ns, name)].manifest(ns, name))

    async def list_workloads(self, request: web.Request) -> web.Response:
        names = self.workloads.get(request.match_info["kind"], [])
        return web.json_response({"kind": "List", "apiVersion": "v1", "items": [
            {"metadata": {"name": n, "namespace": request.match_info["ns"]}} for n in names]})

    # --- imagepullprogress ------------------------------------------------------------
    async def progress(self, request: web.Request) -> web.StreamResponse:
        pod = self.pods[(request.match_info["ns"], request.match_info["pod"])]
        for c in request.query.getall("container", []):
            if c not in pod.containers:
                raise StatusError(400, f'container "{c}" is not in pod '
                                       f'"{request.match_info["pod"]}"')
        if not self.sessions:
            raise StatusError(503, "no scripted session left", retry_after=0)
        s = self.sessions.pop(0) if len(self.sessions) > 1 else self.sessions[0]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for obj in s.objects:
            await resp.write(json.dumps(obj).encode() + b"\n")
            if s.delay:
                await asyncio.sleep(s.delay)
        if s.end == "cut":
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("cut by the test")
        if s.end == "hold":
            await asyncio.sleep(3600)
        with contextlib.suppress(ConnectionResetError):  # the client may leave at Summary
            await resp.write_eof()
        return resp
