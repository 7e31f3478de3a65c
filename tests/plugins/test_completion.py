"""Shell completion through kubectl's plugin-completion convention: real kubectl runs
``kubectl __complete ncp ...``, finds ``kubectl_complete-ncp`` on PATH and relays its
candidates and cobra directive; the candidates come from the fake cluster's API."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.fakeserver import FakeCluster, Pod
from tests.plugins.helpers import kubectl, plugin_env


@pytest.fixture
def env(cluster: FakeCluster, plugin_bin: Path, tmp_path: Path) -> dict[str, str]:
    cluster.pods[("default", "worker")] = Pod({"main": tmp_path})
    cluster.pods[("other", "db")] = Pod({"pg": tmp_path, "exporter": tmp_path})
    cluster.workloads["deployments"] = ["web", "api"]
    return plugin_env(plugin_bin, cluster.kubeconfig())


async def complete(env: dict[str, str], *words: str) -> tuple[list[str], str]:
    r = await kubectl(env, "__complete", *words)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines and lines[-1].startswith(":"), r.out
    return lines[:-1], lines[-1]


@pytest.mark.parametrize(("words", "want", "directive"), [
    (["ncp", ""], ["web:", "worker:"], ":2"),
    (["ncp", "wo"], ["worker:"], ":2"),
    (["ncp", "-n", "other", "d"], ["db:"], ":2"),
    (["ncp", "-n", "other", "-c", ""], [], ":4"),  # no pod typed yet
    (["ncp", "-n", "other", "db:/x", "-c", ""], ["pg", "exporter"], ":4"),
    (["ncp", "web:/etc/x", "-c", "s"], ["side"], ":4"),
    (["ncp", "web:/et"], [], ":4"),  # inside the container: no completion
    (["ncp", "./lo"], [], ":0"),  # a local path: the shell's file completion
    (["ncp", "zz"], [], ":0"),
    (["image-pull-progress", ""],
     ["web", "worker", "deployment/", "statefulset/", "daemonset/", "job/"], ":6"),
    (["image-pull-progress", "de"], ["deployment/"], ":6"),
    (["image-pull-progress", "deployment/"], ["deployment/api", "deployment/web"], ":4"),
    (["image-pull-progress", "w"], ["web", "worker"], ":4"),
    (["image-pull-progress", "web", "-c", ""], ["app", "side"], ":4"),
    (["image-pull-progress", "--granularity", "image", "web", ""], [], ":4"),
    (["image-pull-progress", "-n", ""], [], ":4"),  # the fake lists no namespaces
])
async def test_candidates(env: dict[str, str], words: list[str], want: list[str],
                          directive: str) -> None:
    got, d = await complete(env, *words)
    assert sorted(got) == sorted(want) and d == directive


async def test_flags_typed_before_are_used(cluster: FakeCluster, env: dict[str, str],
                                           tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    env.pop("KUBECONFIG")
    got, d = await complete(env, "ncp", "--kubeconfig", str(missing), "")
    assert (got, d) == ([], ":4")  # no cluster to ask: nothing, and no hang
    got, _ = await complete(env, "ncp", "--kubeconfig", str(cluster.kubeconfig()), "")
    assert got == ["web:", "worker:"]
    assert cluster.requests[-1]["path"] == "/api/v1/namespaces/default/pods"
