"""aggapi.kube.client against a real HTTPS server on 127.0.0.1: kubeconfig and in-cluster
loading, TLS (CA, client certificates, skip-verify), tokens and token rotation,
errors carrying the Status, and watch streams."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.kube import client as kube
from aggapi.kube import kubeconfig
from aggapi.kube.client import KubeClient, KubeConfigError, KubeError, load_client
from aggapi.tls import pki

BIG = "x" * (300 << 10)  # one watch line far beyond aiohttp's readline buffer


@dataclass
class Certs:
    dir: Path
    ca: pki.KeyPair
    client_ca: pki.KeyPair

    def path(self, name: str) -> Path:
        return self.dir / name


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    c = Certs(tmp_path / "pki", pki.new_ca("kube-ca"), pki.new_ca("kube-client-ca"))
    c.ca.write(c.path("ca.crt"), c.path("ca.key"))
    pki.issue(c.ca, "kube-apiserver", ips=["127.0.0.1"], server=True).write(
        c.path("server.crt"), c.path("server.key"))
    pki.issue(c.client_ca, "alice", orgs=("devs",), client=True).write(
        c.path("alice.crt"), c.path("alice.key"))
    return c


@dataclass
class Api:
    """What the fake API server saw."""
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1]


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": reason, "message": message, "code": code},
                             status=code)


def _app(api: Api) -> web.Application:
    async def record(request: web.Request) -> dict[str, Any]:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        cn = ""
        for rdn in (peer or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        seen = {"method": request.method, "path": request.path, "query": dict(request.query),
                "authorization": request.headers.get("Authorization", ""),
                "content_type": request.headers.get("Content-Type", ""),
                "client_cn": cn, "body": await request.text()}
        api.requests.append(seen)
        return seen

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(await record(request))

    async def missing(request: web.Request) -> web.Response:
        await record(request)
        return _status(404, "NotFound", 'pods "missing" not found')

    async def broken(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=502, text="<html>bad gateway</html>")

    async def pods(request: web.Request) -> web.StreamResponse:
        await record(request)
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "5"},
                                      "items": []})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        events = [
            {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
            {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "8"},
                                            "data": BIG}},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                         "message": "too old resource version"}},
        ]
        for i, ev in enumerate(events):
            line = json.dumps(ev).encode() + b"\n"
            if i == 2:  # split the big object across many writes
                for start in range(0, len(line), 7000):
                    await resp.write(line[start:start + 7000])
            else:
                await resp.write(line + (b"\n" if i == 0 else b""))  # blank lines are skipped
            await asyncio.sleep(0.01)
        return resp

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/api/v1/namespaces/ns/pods/missing", missing)
    app.router.add_get("/broken", broken)
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    return app


ServeFn = Callable[..., Awaitable[Api]]


@pytest.fixture
async def serve(certs: Certs) -> AsyncIterator[ServeFn]:
    runners: list[web.AppRunner] = []

    async def start(*, client_cert_required: bool = False, tls: bool = True) -> Api:
        ctx = None
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(certs.path("server.crt"), certs.path("server.key"))
            if client_cert_required:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=certs.client_ca.cert_pem.decode())
        api = Api("")
        runner = web.AppRunner(_app(api), access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        return api

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture(autouse=True)
def not_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


async def test_kubeconfig_with_inline_ca_and_client_cert(
        serve: ServeFn, certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve(client_cert_required=True)
    cert = pki.load_pair(certs.path("alice.crt"), certs.path("alice.key"))
    path = write_kubeconfig(tmp_path / "kubeconfig", f"""
        apiVersion: v1
        kind: Config
        current-context: alice@local
        clusters:
        - name: local
          cluster:
            server: {api.url}/
            certificate-authority-data: {b64(certs.ca.cert_pem)}
        users:
        - name: alice
          user:
            client-certificate-data: {b64(cert.cert_pem)}
            client-key-data: {b64(cert.key_pem)}
        contexts:
        - name: alice@local
          context: {{cluster: local, user: alice}}
        """)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    async with await load_client(path) as client:
        seen = await client.get("/echo")
    assert seen["client_cn"] == "alice" and seen["authorization"] == ""
    assert list(scratch.iterdir()) == []  # the key never stays on disk

    # The server really insists on the certificate.
    async with kube.client_for_url(api.url, ca_file=str(certs.path("ca.crt"))) as anon:
        with pytest.raises(aiohttp.ClientError):
            await anon.get("/echo")


async def test_kubeconfig_with_token_and_relative_ca_path(
        serve: ServeFn, certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve()
    conf = tmp_path / "conf"
    (conf / "ca").mkdir(parents=True)
    (conf / "ca" / "ca.crt").write_bytes(certs.ca.cert_pem)
    path = write_kubeconfig(conf / "config", f"""
        apiVersion: v1
        kind: Config
        current-context: c
        clusters: [{{name: k, cluster: {{server: "{api.url}",
                                        certificate-authority: ca/ca.crt}}}}]
        users: [{{name: u, user: {{token: s3cret}}}}]
        contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
        """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the kubeconfig, not to the cwd
    async with await load_client(path) as client:
        seen = await client.post("/echo", {"spec": {"token": "t"}})
    assert seen["authorization"] == "Bearer s3cret"
    assert seen["method"] == "POST" and json.loads(seen["body"]) == {"spec": {"token": "t"}}
    assert seen["content_type"] == "application/json"


def _two_contexts(api_url: str, certs: Certs) -> str:
    ca = b64(certs.ca.cert_pem)
    return f"""
        apiVersion: v1
        kind: Config
        current-context: first
        clusters:
        - {{name: k, cluster: {{server: "{api_url}", certificate-authority-data: {ca}}}}}
        - {{name: dead, cluster: {{server: "https://127.0.0.1:1"}}}}
        users:
        - {{name: one, user: {{token: token-one}}}}
        - {{name: two, user: {{token: token-two}}}}
        contexts:
        - {{name: first, context: {{cluster: k, user: one}}}}
        - {{name: second, context: {{cluster: k, user: two}}}}
        - {{name: broken, context: {{cluster: dead, user: two}}}}
        """


async def test_context_selection_and_kubeconfig_env(
        serve: ServeFn, certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve()
    path = write_kubeconfig(tmp_path / "kc", _two_contexts(api.url, certs))
    async with await load_client(path, context="second") as client:
        assert (await client.get("/echo"))["authorization"] == "Bearer token-two"
    # $KUBECONFIG: its first entry, and its current-context.
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([path, str(tmp_path / "absent")]))
    async with await load_client() as client:
        assert (await client.get("/echo"))["authorization"] == "Bearer token-one"
    with pytest.raises(KubeConfigError, match="no context named 'nope'"):
        await load_client(path, context="nope")
    async with await load_client(path, context="broken") as client:
        with pytest.raises(aiohttp.ClientError):
            await client.get("/echo")


async def test_insecure_skip_tls_verify(serve: ServeFn, tmp_path: Path) -> None:
    api = await serve()
    template = """
        apiVersion: v1
        current-context: c
        clusters: [{{name: k, cluster: {{server: "{url}"{extra}}}}}]
        users: [{{name: u, user: {{}}}}]
        contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
        """
    insecure = write_kubeconfig(tmp_path / "insecure",
                                template.format(url=api.url,
                                                extra=", insecure-skip-tls-verify: true"))
    async with await load_client(insecure) as client:
        assert (await client.get("/echo"))["path"] == "/echo"
    # Without the flag and without a CA, the system trust store rejects our test CA.
    strict = write_kubeconfig(tmp_path / "strict", template.format(url=api.url, extra=""))
    async with await load_client(strict) as client:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get("/echo")


async def test_in_cluster_with_rotating_token(
        serve: ServeFn, certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve()
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(certs.ca.cert_pem)
    pki.write_file(sa / "token", b"sa-token-1\n")
    port = api.url.rsplit(":", 1)[1]
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    # A kubeconfig in the environment does not win over in-cluster credentials.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    async with await load_client() as client:
        assert client.server == f"https://127.0.0.1:{port}"
        assert (await client.get("/echo"))["authorization"] == "Bearer sa-token-1"
        assert (await client.get("/echo"))["authorization"] == "Bearer sa-token-1"
        pki.write_file(sa / "token", b"sa-token-2\n")  # replaced by rename, as kubelet does
        assert (await client.get("/echo"))["authorization"] == "Bearer sa-token-2"


async def test_in_cluster_without_service_account_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="token does not exist"):
        await load_client()


async def test_token_file_rewritten_in_place(serve: ServeFn, certs: Certs,
                                             tmp_path: Path) -> None:
    api = await serve()
    token = tmp_path / "token"
    token.write_text("first")
    path = write_kubeconfig(tmp_path / "kc", f"""
        apiVersion: v1
        current-context: c
        clusters: [{{name: k, cluster: {{server: "{api.url}",
                                        certificate-authority-data: {b64(certs.ca.cert_pem)}}}}}]
        users: [{{name: u, user: {{tokenFile: token}}}}]
        contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
        """)
    async with await load_client(path) as client:
        assert (await client.get("/echo"))["authorization"] == "Bearer first"
        token.write_text("second-token")  # same inode: size and mtime tell the change
        assert (await client.get("/echo"))["authorization"] == "Bearer second-token"


@pytest.mark.parametrize("user, what", [
    ("{exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}", "exec"),
    ("{auth-provider: {name: oidc}}", "auth-provider"),
])
async def test_unsupported_credentials_are_refused(tmp_path: Path, user: str, what: str) -> None:
    path = write_kubeconfig(tmp_path / "kc", f"""
        current-context: c
        clusters: [{{name: k, cluster: {{server: "https://127.0.0.1:6443"}}}}]
        users: [{{name: u, user: {user}}}]
        contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
        """)
    with pytest.raises(KubeConfigError, match=what):
        await load_client(path)


async def test_errors_carry_status_and_message(serve: ServeFn) -> None:
    api = await serve(tls=False)
    async with kube.client_for_url(api.url, token="t") as client:
        with pytest.raises(KubeError) as err:
            await client.get("/api/v1/namespaces/ns/pods/missing")
        assert err.value.status == 404
        assert err.value.reason == "NotFound"
        assert err.value.message == 'pods "missing" not found'
        assert api.last["authorization"] == "Bearer t"
        with pytest.raises(KubeError) as err:
            await client.get("/broken")
        assert err.value.status == 502 and err.value.reason == "Bad Gateway"
        assert "bad gateway" in err.value.message


async def test_watch_reads_events_until_the_stream_ends(serve: ServeFn) -> None:
    api = await serve(tls=False)
    async with KubeClient(api.url) as client:
        listed = await client.get("/api/v1/namespaces/ns/pods", {"fieldSelector": "a=b"})
        rv = listed["metadata"]["resourceVersion"]
        events = [(kind, obj) async for kind, obj in client.watch(
            "/api/v1/namespaces/ns/pods", {"fieldSelector": "a=b"},
            resource_version=rv, timeout_seconds=30)]
    assert [k for k, _ in events] == ["ADDED", "BOOKMARK", "MODIFIED", "ERROR"]
    assert events[2][1]["data"] == BIG
    assert events[3][1]["code"] == 410
    assert api.last["query"] == {"fieldSelector": "a=b", "watch": "true",
                                 "allowWatchBookmarks": "true", "resourceVersion": "5",
                                 "timeoutSeconds": "30"}


async def test_watch_refuses_endless_lines(serve: ServeFn,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve(tls=False)
    monkeypatch.setattr(kube, "MAX_WATCH_LINE", 100_000)
    seen: list[str] = []
    async with KubeClient(api.url) as client:
        with pytest.raises(KubeError, match="larger than"):
            async for kind, _obj in client.watch("/api/v1/namespaces/ns/pods"):
                seen.append(kind)
    assert seen == ["ADDED", "BOOKMARK"]


def test_path_segment() -> None:
    assert kube.path_segment("web-0") == "web-0"
    assert kube.path_segment("a/b c") == "a%2Fb%20c"
    for bad in ("", ".", ".."):
        with pytest.raises(ValueError):
            kube.path_segment(bad)


def test_apiserver_does_not_import_kubernetes_asyncio() -> None:
    """~40 MiB of model classes: the apiserver must stay under its memory budget."""
    code = ("import sys, aggapi.apiserver.main, aggapi.apiserver.app\n"
            "print(sorted(m for m in sys.modules if m.startswith('kubernetes')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == "[]"


async def test_open_watches_do_not_use_up_the_request_pool(unused_tcp_port: int) -> None:
    """More watches open than the request pool allows: a SubjectAccessReview-like call
    still goes through (watches have their own pool)."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n')
        await release.wait()
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"kind": "SubjectAccessReview", "status": {"allowed": True}})

    app = web.Application()
    app.router.add_get("/watch", hang)
    app.router.add_post("/review", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    gens = []
    try:
        async with KubeClient(f"http://127.0.0.1:{unused_tcp_port}", limit=2) as client:
            for _ in range(3):
                gen = client.watch("/watch")
                assert (await anext(gen))[0] == "ADDED"
                gens.append(gen)
            answer = await asyncio.wait_for(client.post("/review", {}), 5)
            assert answer["status"]["allowed"] is True
            release.set()
            for gen in gens:
                await gen.aclose()
    finally:
        release.set()
        await runner.cleanup()


async def test_a_big_answer_is_parsed_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A list page of 500 pods is a megabyte: tens of ms of parsing that would hold
    every other request and watch of the process."""
    import threading

    from tests.framework.fakekube import FakeKube
    fake = FakeKube()
    for i in range(3):
        fake.put("api/v1", "configmaps", {"metadata": {"name": f"c{i}", "namespace": "ns"},
                                          "data": {"x": "y" * 40_000}})
    await fake.start()
    threads: list[str] = []
    real = kube.loads

    def recording(raw: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return real(raw)
    monkeypatch.setattr(kube, "loads", recording)
    api = fake.kube_client()
    try:
        assert len((await api.get("/api/v1/namespaces/ns/configmaps"))["items"]) == 3
        await api.get("/api/v1/namespaces/ns/configmaps/c0")  # 40 kB: inline
    finally:
        await api.close()
        await fake.stop()
    main = threading.main_thread().name
    assert threads[0] != main and threads[1] == main, threads
