"""aggapi.kube.client's loading against a real HTTPS server on 127.0.0.1: kubeconfig and
in-cluster, TLS (CA, client certificates, skip-verify), tokens and token rotation, the
credentials it refuses."""

from __future__ import annotations

import base64
import json
import os
import textwrap
from pathlib import Path

import aiohttp
import pytest

from aggapi.kube import client as kube
from aggapi.kube import kubeconfig
from aggapi.kube.client import KubeConfigError, load_client
from aggapi.tls import pki
from tests.kube.client.conftest import Certs, ServeFn


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
