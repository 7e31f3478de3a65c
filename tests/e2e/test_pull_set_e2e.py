"""kubectl image-pull-progress over many pods, through real kubectl and kube-apiserver.

The target is resolved by the plugin (a Deployment's spec.selector, -l, --node), the pods
are listed and watched in kube-apiserver, and each pod's pulls come from the agent's
imagepullprogress stream while the kubelet stand-in pulls through CRI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.controlplane import ControlPlane
from tests.framework.node import Node
from tests.framework.pods import ContainerSpec
from tests.framework.procs import Proc
from tests.framework.standin import StandinKubelet, StandinPod, SyncStandin
from tests.plugins.helpers import install_plugins, kubectl, plugin_env

from .conftest import delete_pod, remove_big_image
from .conftest import kubectl as kubectl_admin

APP = "pullset-web"
LABELS = {"app": APP, "tier": "web"}


def deployment() -> dict[str, object]:
    pod_labels = dict(LABELS)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": "default"},
        # 0 replicas: kube-controller-manager runs in the harness, and pods it made would
        # be bound to the stand-in's node, which runs only the pods the test starts.
        "spec": {"replicas": 0,
                 "selector": {"matchLabels": {"app": APP},
                              "matchExpressions": [{"key": "tier", "operator": "In",
                                                    "values": ["web"]}]},
                 "template": {"metadata": {"labels": pod_labels},
                              "spec": {"containers": [{"name": "app", "image": "unused"}]}}}}


@pytest.fixture(scope="module")
def plugin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugins") / "bin"
    install_plugins(d)
    return d


def create(standin: SyncStandin, name: str, image: str,
           labels: dict[str, str]) -> StandinPod:
    async def go(k: StandinKubelet) -> StandinPod:
        return await k.create(name, [ContainerSpec("app", image)], labels=labels)

    return standin.call(go)


def start(standin: SyncStandin, pod: StandinPod) -> None:
    async def go(k: StandinKubelet) -> StandinPod:
        return await k.start(pod)

    standin.spawn(go)


@pytest.fixture
def pods(standin: SyncStandin, node: Node) -> Iterator[list[StandinPod]]:
    made: list[StandinPod] = []
    yield made
    node.set_rate(None)
    for p in made:
        delete_pod(standin, p)
    remove_big_image(standin, node)


async def test_deployment_pods_are_followed_as_they_appear(
        control_plane: ControlPlane, node: Node, node_agent: Proc, standin: SyncStandin,
        plugin_bin: Path, pods: list[StandinPod]) -> None:
    """``deployment/NAME``: the plugin reads the Deployment's selector (matchLabels and
    matchExpressions), follows the two pods there at the start and the third one that
    appears later, ignores a pod outside the selector, and exits 0 once all three
    images are present.

    The Deployment has 0 replicas, so its controller makes no pod: the pods are created
    by hand with the template's labels and bound to the stand-in kubelet's node, which
    runs only what the test starts. The variant where kube-controller-manager makes 3
    replicas for the real kubelet is tests/e2e/kubelet/test_rollout_kubelet.py."""
    r = await kubectl_admin(control_plane, "apply", "-f", "-", user=None,
                            stdin=json.dumps(deployment()).encode())
    assert r.rc == 0, r.err
    try:
        total = sum(size for _, size in node.images.big_layers)
        remove_big_image(standin, node)
        node.set_rate(total / 8)  # ~8 s per pull, shared by the pods pulling it
        image = node.via_throttle(node.images.big)
        for i in range(2):
            pods.append(create(standin, f"{APP}-{i}", image, LABELS))
        pods.append(create(standin, "pullset-decoy", node.images.busybox, {"app": "decoy"}))
        env = plugin_env(plugin_bin, control_plane.admin_kubeconfig)
        run = asyncio.create_task(kubectl(env, "image-pull-progress", f"deployment/{APP}",
                                          "-n", "default", timeout=240))
        await asyncio.sleep(2.0)
        for p in pods[:2]:
            start(standin, p)
        await asyncio.sleep(2.0)
        late = create(standin, f"{APP}-2", image, LABELS)
        pods.append(late)
        start(standin, late)
        res = await run
    finally:
        await kubectl_admin(control_plane, "delete", "deployment", APP, "-n", "default",
                            "--wait=false", user=None)
    assert res.rc == 0, (res.out, res.err)
    shown = {ln.split()[0] for ln in res.out.splitlines() if ln.strip()}
    assert shown == {f"default/{APP}-{i}" for i in range(3)}, res.out
    # Every pod's last line is a present image; the late pod was seen before it was done.
    last = {}
    for ln in res.out.splitlines():
        last[ln.split()[0]] = ln
    assert all(ln.split()[3] in ("Done", "AlreadyPresent") for ln in last.values()), res.out
    late_lines = [ln for ln in res.out.splitlines() if ln.startswith(f"default/{APP}-2 ")]
    assert len(late_lines) >= 2, res.out


async def test_fail_fast_on_a_pull_in_backoff(
        control_plane: ControlPlane, node: Node, node_agent: Proc, standin: SyncStandin,
        plugin_bin: Path, pods: list[StandinPod]) -> None:
    """``-l`` and ``--fail-fast``: a pod whose image does not exist goes to
    ErrImagePull/ImagePullBackOff (kubelet's reasons); the plugin stops with exit 1 and
    names the pod, instead of waiting for kubelet's retries."""
    missing = node.via_registry("aggapi-e2e/no-such-image:1")
    pods.append(create(standin, "pullset-broken", missing, {"app": "pullset-broken"}))
    env = plugin_env(plugin_bin, control_plane.admin_kubeconfig)
    run = asyncio.create_task(kubectl(env, "image-pull-progress", "-l", "app=pullset-broken",
                                      "--node", node.name, "--fail-fast", "-n", "default",
                                      timeout=120))
    await asyncio.sleep(1.0)
    start(standin, pods[-1])
    res = await run
    assert res.rc == 1, (res.out, res.err)
    assert "error: default/pullset-broken" in res.err, res.err
    assert "BackOff" in res.out or "Failed" in res.out, res.out
