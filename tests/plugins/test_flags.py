"""kubectl's global connection flags, as both plugins take them (through real kubectl
against the fake cluster), and kubectl cp's own flags in ncp."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.client.connection import Connection, ConnectionFlags, subresource_path
from aggapi.client.errors import ConfigError
from aggapi.plugins.common import duration
from tests.client.fakeserver import FakeCluster, Session
from tests.plugins.helpers import kubectl, plugin_env

DATA = os.urandom(300_000)
UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.sampled_from(list(UNITS))), min_size=1,
                max_size=4))
def test_request_timeout_reads_go_durations(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    assert duration(text) == pytest.approx(sum(n * UNITS[u] for n, u in parts))


@pytest.mark.parametrize(("text", "secs"), [("0", 0.0), ("30", 30.0), ("1.5", 1.5),
                                            ("1m30s", 90.0), ("250ms", 0.25)])
def test_request_timeout_examples(text: str, secs: float) -> None:
    assert duration(text) == secs


@pytest.mark.parametrize("text", ["", "1x", "m", "1 m", "-1s", "1m30"])
def test_request_timeout_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        duration(text)


@pytest.fixture
def env(cluster: FakeCluster, plugin_bin: Path) -> dict[str, str]:
    (cluster.pods[("default", "web")].containers["app"] / "data/f").write_bytes(DATA)
    return plugin_env(plugin_bin, cluster.kubeconfig())


def no_config(env: dict[str, str], home: Path) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k != "KUBECONFIG"}
    out["HOME"] = str(home)
    return out


async def test_impersonation_headers(cluster: FakeCluster, env: dict[str, str],
                                     tmp_path: Path) -> None:
    r = await kubectl(env, "ncp", "--as", "bob", "--as-group", "dev", "--as-group", "ops",
                      "-c", "app", "web:/data/f", str(tmp_path / "f"))
    assert r.rc == 0, r.err
    items = cluster.requests[-1]["header_items"]
    assert ("Impersonate-User", "bob") in items
    assert [v for k, v in items if k == "Impersonate-Group"] == ["dev", "ops"]
    r = await kubectl(env, "image-pull-progress", "--as-group", "dev", "web")
    assert r.rc == 1 and r.err.startswith("error: requesting groups (--as-group) without "
                                          "impersonating a user (--as)"), r.err


async def test_server_and_token_without_a_kubeconfig(cluster: FakeCluster,
                                                     env: dict[str, str],
                                                     tmp_path: Path) -> None:
    cluster.tokens["tok-carol"] = "carol"
    bare = no_config(env, tmp_path)
    for tls in (["--certificate-authority", str(cluster.ca_file)],
                ["--insecure-skip-tls-verify"]):
        r = await kubectl(bare, "ncp", "-s", cluster.url, "--token", "tok-carol", *tls,
                          "-c", "app", "web:/data/f", str(tmp_path / "f"))
        assert r.rc == 0, r.err
        assert cluster.requests[-1]["user"] == "carol"
    r = await kubectl(bare, "ncp", "-s", cluster.url, "--token", "tok-carol", "--retries=0",
                      "-c", "app", "web:/data/f", str(tmp_path / "g"))
    assert r.rc == 1 and "certificate verify failed" in r.err, r.err  # no CA: not trusted


async def test_token_overrides_the_kubeconfig_user(cluster: FakeCluster, env: dict[str, str],
                                                   tmp_path: Path) -> None:
    cluster.tokens["tok-dave"] = "dave"
    r = await kubectl(env, "ncp", "--token", "tok-dave", "-c", "app", "web:/data/f",
                      str(tmp_path / "f"))
    assert r.rc == 0, r.err
    assert cluster.requests[-1]["headers"]["Authorization"] == "Bearer tok-dave"


async def test_cluster_and_user_pick_kubeconfig_entries(cluster: FakeCluster,
                                                        plugin_bin: Path,
                                                        tmp_path: Path) -> None:
    import json

    kc = cluster.kubeconfig("alice", "token")
    doc = json.loads(kc.read_text())
    cluster.tokens["tok-erin"] = "erin"
    doc["users"].append({"name": "erin", "user": {"token": "tok-erin"}})
    doc["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}})
    doc["contexts"][0]["context"]["cluster"] = "nowhere"
    kc.write_text(json.dumps(doc))
    env = plugin_env(plugin_bin, kc)
    r = await kubectl(env, "ncp", "--cluster", "fake", "--user", "erin", "-c", "app",
                      "web:/data", str(tmp_path / "d"))
    assert r.rc == 0, r.err
    assert cluster.requests[-1]["user"] == "erin"
    r = await kubectl(env, "ncp", "--user", "nobody", "web:/data", str(tmp_path / "e"))
    assert r.rc == 1 and "no user named 'nobody'" in r.err, r.err


async def test_v6_logs_each_request_as_kubectl(cluster: FakeCluster, env: dict[str, str],
                                               tmp_path: Path) -> None:
    r = await kubectl(env, "ncp", "-v=6", "-c", "app", "web:/data/f", str(tmp_path / "f"))
    assert r.rc == 0, r.err
    lines = [x for x in r.err.splitlines() if "milliseconds" in x]
    assert lines and all(re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] ", x)
                         for x in lines), r.err
    assert re.search(r"\] GET https://127\.0\.0\.1:\d+/apis/subresources\.aggapi\.io/v1alpha1"
                     r"/watch/namespaces/default/pods/web/copy\?container=app&path=/data/f"
                     r"&digest=trailer"
                     r" 200 OK in \d+ milliseconds$", r.err, re.M), r.err
    assert "Bearer" not in r.err
    r = await kubectl(env, "ncp", "--v", "7", "--token", "secret-token", "-c", "app",
                      "web:/data/f", str(tmp_path / "g"))
    assert "Authorization: Bearer <masked>" in r.err and "secret-token" not in r.err
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/f", str(tmp_path / "h"))
    assert "milliseconds" not in r.err  # quiet without -v


async def test_missing_kubeconfig_says_so(env: dict[str, str], tmp_path: Path) -> None:
    r = await kubectl(no_config(env, tmp_path), "ncp", "web:/data/f", str(tmp_path / "f"))
    assert r.rc == 1
    assert r.err == ("error: no configuration has been provided: ~/.kube/config does not "
                     "exist and neither --kubeconfig, $KUBECONFIG nor --server was given\n")
    r = await kubectl({**env, "KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}, "image-pull-progress",
                      "web")
    assert r.rc == 1 and r.err.startswith("error: cannot read kubeconfig: no file of "
                                          "$KUBECONFIG exists"), r.err


async def test_request_timeout_cuts_a_slow_request(cluster: FakeCluster) -> None:
    cluster.sessions.append(Session([{"kind": "Progress"}, {"kind": "Progress"}], delay=2))
    flags = ConnectionFlags(kubeconfig=str(cluster.kubeconfig()), request_timeout=0.3)
    path = subresource_path("default", "web", "imagepullprogress")
    async with await Connection.load(flags=flags) as c:
        with pytest.raises(asyncio.TimeoutError):
            async with c.request("GET", path) as resp:
                await resp.read()
    async with await Connection.load(flags=ConnectionFlags(
            kubeconfig=str(cluster.kubeconfig()))) as c:  # no limit: it ends by itself
        async with c.request("GET", path) as resp:
            assert (await resp.read()).count(b"Progress") == 2
    with pytest.raises(ConfigError, match="no such file"):
        await Connection.load(flags=ConnectionFlags(kubeconfig="/nonexistent"))


# --- kubectl cp's flags in ncp ----------------------------------------------------------

async def test_relative_container_path_starts_at_the_cwd(
        cluster: FakeCluster, env: dict[str, str], tmp_path: Path) -> None:
    pod = cluster.pods[("default", "web")]
    pod.cwd = "/data"
    r = await kubectl(env, "ncp", "-c", "app", "web:f", str(tmp_path / "f"))
    assert r.rc == 0, r.err
    assert (tmp_path / "f").read_bytes() == DATA
    assert ("path", "f") in cluster.requests[-1]["query"]  # sent as typed
    (tmp_path / "up").write_bytes(b"up")
    r = await kubectl(env, "ncp", "-c", "app", str(tmp_path / "up"), "web:")
    assert r.rc == 0, r.err
    assert (pod.containers["app"] / "data/up").read_bytes() == b"up"


async def test_default_container_annotation_and_notice(
        cluster: FakeCluster, env: dict[str, str], tmp_path: Path) -> None:
    pod = cluster.pods[("default", "web")]
    (pod.containers["side"] / "data/f").write_bytes(b"side")
    pod.annotations["kubectl.kubernetes.io/default-container"] = "side"
    r = await kubectl(env, "ncp", "web:/data/f", str(tmp_path / "f"))
    assert r.rc == 0, r.err
    assert r.err.startswith('Defaulted container "side" out of: app, side\n'), r.err
    assert (tmp_path / "f").read_bytes() == b"side"
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/f", str(tmp_path / "g"))
    assert "Defaulted" not in r.err and (tmp_path / "g").read_bytes() == DATA


async def test_no_preserve(cluster: FakeCluster, env: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "run.sh"
    src.write_bytes(b"#!/bin/sh\n")
    src.chmod(0o700)
    r = await kubectl(env, "ncp", "--no-preserve", "-c", "app", str(src), "web:/data/run.sh")
    assert r.rc == 0, r.err
    assert not any(k == "mode" for k, _ in cluster.requests[-1]["query"])
    r = await kubectl(env, "ncp", "-c", "app", str(src), "web:/data/run2.sh")
    assert ("mode", "700") in cluster.requests[-1]["query"]
    root = cluster.pods[("default", "web")].containers["app"]
    (root / "data/f").chmod(0o751)
    os.umask(old := os.umask(0))
    r = await kubectl(env, "ncp", "--no-preserve", "-c", "app", "web:/data/f",
                      str(tmp_path / "np"))
    assert r.rc == 0, r.err
    assert (tmp_path / "np").stat().st_mode & 0o777 == 0o666 & ~old
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/f", str(tmp_path / "p"))
    assert (tmp_path / "p").stat().st_mode & 0o777 == 0o751 & ~old


@pytest.mark.parametrize(("retries", "rc"), [("0", 1), ("3", 0), ("-1", 0)])
async def test_retries(cluster: FakeCluster, env: dict[str, str], tmp_path: Path,
                       retries: str, rc: int) -> None:
    cluster.cut_download_after = 100_000
    r = await kubectl(env, "ncp", f"--retries={retries}", "-c", "app", "web:/data/f",
                      str(tmp_path / "f"))
    assert r.rc == rc, r.err
    if rc == 0:
        assert (tmp_path / "f").read_bytes() == DATA and "1 reconnects" in r.err
    else:
        assert "partial download kept" in r.err
