"""Credentials from kubeconfigs (client cert, token, exec plugin) and typed errors."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aggapi.client import errors
from aggapi.client.connection import Connection, subresource_path
from aggapi.client.copy import RemotePath, stat_remote
from aggapi.tls import pki
from tests.client.fakeserver import FakeCluster

WEB = RemotePath("default", "web", "/data", "app")


@pytest.mark.parametrize("auth", ["cert", "token", "exec"])
async def test_each_credential_kind_authenticates(cluster: FakeCluster, auth: str) -> None:
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig("alice", auth))) as c:
        st = await stat_remote(c, WEB)
    assert st["type"] == "dir"
    assert cluster.requests[-1]["user"] == "alice"


async def test_exec_plugin_is_rerun_after_401(cluster: FakeCluster) -> None:
    kc = cluster.kubeconfig("alice", "exec", exec_tokens=["tok-stale", "tok-fresh"])
    del cluster.tokens["tok-stale"]  # revoked: the server answers 401 to it
    async with await Connection.from_kubeconfig(str(kc)) as c:
        await stat_remote(c, WEB)
        await stat_remote(c, WEB)
    users = [r["user"] for r in cluster.requests]
    assert users == [None, "alice", "alice"]
    assert cluster.exec_runs() == 2


def exec_user(kc: Path, status: dict[str, Any]) -> Path:
    """Point the kubeconfig's user at an exec plugin printing ``status`` and counting runs."""
    runs = kc.parent / "exec-runs"
    runs.write_text("")
    cred = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
            "status": status}
    script = (f"import pathlib; p = pathlib.Path({str(runs)!r}); "
              f"p.write_text(p.read_text() + 'x'); print({json.dumps(cred)!r})")
    doc = json.loads(kc.read_text())
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                        "command": sys.executable, "args": ["-c", script],
                                        "interactiveMode": "Never"}}
    kc.write_text(json.dumps(doc))
    return runs


@pytest.mark.parametrize(("expires_in", "runs"), [(-60, 3), (3600, 1)])
async def test_exec_credential_is_fetched_again_once_expired(
        cluster: FakeCluster, expires_in: int, runs: int) -> None:
    kc = cluster.kubeconfig("alice", "token")
    when = datetime.fromtimestamp(time.time() + expires_in, UTC)
    counter = exec_user(kc, {"token": "tok-alice",
                             "expirationTimestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ")})
    async with await Connection.from_kubeconfig(str(kc)) as c:
        for _ in range(3):
            await stat_remote(c, WEB)
    assert counter.read_text() == "x" * runs
    assert [r["user"] for r in cluster.requests] == ["alice"] * 3


async def test_exec_plugin_may_hand_out_a_client_certificate(cluster: FakeCluster) -> None:
    kp = pki.issue(cluster.ca, "bob", client=True)
    kc = cluster.kubeconfig("alice", "token")
    exec_user(kc, {"clientCertificateData": kp.cert_pem.decode(),
                   "clientKeyData": kp.key_pem.decode()})
    async with await Connection.from_kubeconfig(str(kc)) as c:
        await stat_remote(c, WEB)
    assert cluster.requests[-1]["user"] == "bob"


async def test_config_problems_are_client_errors(cluster: FakeCluster, tmp_path: Path) -> None:
    """No exception of another library leaks out of aggapi.client: all are ConfigError."""
    with pytest.raises(errors.ConfigError, match="cannot read kubeconfig"):
        await Connection.from_kubeconfig(str(tmp_path / "missing"))
    kc = cluster.kubeconfig("alice", "token")
    with pytest.raises(errors.ConfigError, match="no context named 'nope'"):
        await Connection.from_kubeconfig(str(kc), context="nope")
    (tmp_path / "bad").write_text("clusters: [")
    with pytest.raises(errors.ConfigError, match="cannot parse"):
        await Connection.from_kubeconfig(str(tmp_path / "bad"))
    exec_user(kc, {"token": "x"})
    doc = json.loads(kc.read_text())
    doc["users"][0]["user"]["exec"]["args"] = ["-c", "import sys; sys.exit(3)"]
    kc.write_text(json.dumps(doc))
    async with await Connection.from_kubeconfig(str(kc)) as c:
        with pytest.raises(errors.ConfigError, match="exited with status 3"):
            await stat_remote(c, WEB)
    assert issubclass(errors.ConfigError, errors.AggapiError)


async def test_kubeconfig_list_as_kubectl_reads_it(cluster: FakeCluster, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    first = cluster.kubeconfig("alice", "token", namespace="team-a")
    other = tmp_path / "other"
    doc = json.loads(first.read_text())
    doc["contexts"][0]["name"] = doc["current-context"] = "other"
    doc["contexts"][0]["context"]["namespace"] = "team-b"
    other.write_text(json.dumps(doc))
    path = os.pathsep.join([str(tmp_path / "missing"), str(other), str(first)])
    monkeypatch.setenv("KUBECONFIG", path)
    async with await Connection.from_kubeconfig() as c:
        assert c.namespace == "team-b"  # the first current-context set wins
    async with await Connection.from_kubeconfig(context="fake") as c:
        assert c.namespace == "team-a"  # found in the file that names it
        await stat_remote(c, WEB)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing")] * 2))
    with pytest.raises(errors.ConfigError):
        await Connection.from_kubeconfig()


async def test_context_namespace_is_the_default(cluster: FakeCluster) -> None:
    kc = cluster.kubeconfig("alice", "token", namespace="team-a")
    async with await Connection.from_kubeconfig(str(kc)) as c:
        assert c.namespace == "team-a"
        assert c.server == cluster.url


async def test_typed_errors_carry_the_status(cluster: FakeCluster) -> None:
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.NotFound) as nf:
            await stat_remote(c, RemotePath("default", "nope", "/x"))
        assert nf.value.status["message"] == 'pods "nope" not found'
        assert nf.value.status["code"] == 404
        with pytest.raises(errors.NotFound, match="not found in the container"):
            await stat_remote(c, RemotePath("default", "web", "/missing", "app"))
        with pytest.raises(errors.NotFound, match='container "zzz"'):
            await stat_remote(c, RemotePath("default", "web", "/data", "zzz"))
        with pytest.raises(errors.BadRequest, match="container is required"):
            await stat_remote(c, RemotePath("default", "web", "/data"))
    async with await Connection.from_kubeconfig(
            str(cluster.kubeconfig("mallory", "token"))) as c:
        with pytest.raises(errors.Forbidden, match='User "mallory" cannot watch'):
            await stat_remote(c, WEB)
    kc = cluster.kubeconfig("alice", "token")
    doc = json.loads(kc.read_text())
    doc["users"][0]["user"] = {"token": "wrong"}
    kc.write_text(json.dumps(doc))
    async with await Connection.from_kubeconfig(str(kc)) as c:
        with pytest.raises(errors.Unauthorized) as ua:
            await stat_remote(c, WEB)
    assert isinstance(ua.value, errors.AggapiError)


@pytest.mark.parametrize(("code", "cls"), [
    (400, errors.BadRequest), (401, errors.Unauthorized), (403, errors.Forbidden),
    (404, errors.NotFound), (409, errors.Conflict), (413, errors.TooLarge),
    (429, errors.TooManyRequests), (503, errors.ServiceUnavailable),
    (507, errors.InsufficientStorage), (599, errors.InternalError), (418, errors.BadRequest)])
def test_error_classes_by_code(code: int, cls: type[errors.AggapiError]) -> None:
    body = json.dumps({"kind": "Status", "code": code, "message": f"m{code}",
                       "details": {"retryAfterSeconds": 7}}).encode()
    err = errors.error_from_response(code, body, {})
    assert type(err) is cls
    assert err.message == f"m{code}" and err.status["code"] == code
    assert err.retry_after == 7


def test_retry_after_header_wins_and_plain_bodies_still_type() -> None:
    err = errors.error_from_response(429, b"slow down", {"Retry-After": "3"})
    assert isinstance(err, errors.TooManyRequests)
    assert err.retry_after == 3.0
    assert err.status["message"] == "slow down" and err.status["reason"] == "TooManyRequests"


def test_watch_path() -> None:
    assert subresource_path("ns", "p", "copy") == \
        "/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/ns/pods/p/copy"
    assert "/watch/" not in subresource_path("ns", "p", "copy", watch=False)


