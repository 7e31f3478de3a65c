"""A rollout followed with ``kubectl image-pull-progress deployment/NAME`` (issue 14).

kube-controller-manager makes the Deployment's 3 replicas, kube-scheduler places them on
the harness node, and the real kubelet pulls their image through the throttle proxy. The
plugin runs as users run it: ``kubectl`` finds ``kubectl-image_pull_progress`` on PATH,
with a kubeconfig for the real kube-apiserver and stdout a pipe (plain lines, no tty).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.plugins.common import EXIT_FAIL, EXIT_OK
from tests.e2e.kubelet.conftest import ProgressStream, forget_images, wait_for
from tests.framework import oci
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import OCI_CACHE, Node
from tests.plugins.helpers import KUBECTL, install_plugins, plugin_env

MiB = 1 << 20
IMAGE = "aggapi-test/rollout:1"
LAYER = 24 * MiB
RATE = 3 * MiB  # the first pull takes ~8 s; kubelet serializes the other two behind it
APP, BROKEN = "rollout-web", "rollout-broken"
PCT = re.compile(r"^(\d+)%$")


@pytest.fixture(scope="module")
def rollout_layers(node: Node) -> list[tuple[str, int]]:
    """An image of its own (no layer shared with other tests but busybox's), so the
    first replica really downloads it. (digest, size) of each layer."""
    cache = oci.BlobCache(OCI_CACHE)
    image = oci.build_image([cache.busybox_layer(), cache.random_layer(LAYER, seed="rollout")],
                            cmd=["/bin/busybox", "sleep", "3600"],
                            labels={"io.aggapi.test": "rollout"})
    repo, tag = IMAGE.split(":")
    oci.push_image(node.info.registry_host, repo, image, tag)
    return [(la.blob.digest, la.blob.size) for la in image.layers]


@pytest.fixture(scope="module")
def plugin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugins") / "bin"
    install_plugins(d)
    return d


# While a multi-node cluster (tests.framework.cluster) is up, the harness node carries
# this NoSchedule taint; the replicas must still go to the real kubelet watched here.
STANDIN_TAINT = "aggapi.io/standin-node"


def deployment(name: str, node: str, image: str, replicas: int) -> dict[str, Any]:
    """Pods quick to delete, without service account token or DNS (the harness has
    neither a token controller's CA bundle nor a DNS service), scheduled by
    kube-scheduler onto ``node``, whose agent the aggapi apiserver asks."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "containers": [{"name": "app", "image": image,
                                     "imagePullPolicy": "IfNotPresent"}],
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": STANDIN_TAINT, "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "dnsPolicy": "Default"}}}}


def remove(cp: ControlPlane, name: str) -> None:
    cp.kubectl("delete", "deployment", name, "-n", "default", "--ignore-not-found",
               "--wait=true", check=False)
    cp.kubectl("delete", "pods", "-n", "default", "-l", f"app={name}", "--grace-period=0",
               "--force", "--wait=true", "--ignore-not-found", check=False)


def pod_names(cp: ControlPlane, app: str) -> list[str]:
    out = json.loads(cp.kubectl("get", "pods", "-n", "default", "-l", f"app={app}", "-o",
                                "json").stdout)
    return sorted(str(p["metadata"]["name"]) for p in out.get("items") or []
                  if not (p.get("metadata") or {}).get("deletionTimestamp"))


def plugin(cp: ControlPlane, plugin_bin: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([KUBECTL, "image-pull-progress", *args, "-n", "default"],
                            env=plugin_env(plugin_bin, cp.admin_kubeconfig),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"plugin still running after {timeout}s:\n{out}\n{err}") from None
    return proc.returncode, out, err


@pytest.fixture
def cleanup(control_plane: ControlPlane, node: Node) -> Iterator[None]:
    yield
    node.set_rate(None)
    for name in (APP, BROKEN):
        remove(control_plane, name)


def test_deployment_rollout_followed_to_the_end(
        control_plane: ControlPlane, node: Node, real_node: Kubelet,
        rollout_layers: list[tuple[str, int]], plugin_bin: Path, cleanup: None) -> None:
    """3 controller-made replicas: every pod appears in the plugin's output with its
    progress, each pod's layers are reported one by one, and the plugin exits 0 once
    the image is present for all three."""
    cp = control_plane
    remove(cp, APP)  # left by an earlier failed run
    forget_images(node, IMAGE)
    image = node.via_throttle(IMAGE)
    node.set_rate(RATE)
    cp.kubectl("apply", "-f", "-", input=json.dumps(deployment(APP, node.name, image, 3)))
    proc = plugin(cp, plugin_bin, f"deployment/{APP}")
    streams: dict[str, ProgressStream] = {}
    try:
        names = wait_for(lambda: (n if len(n := pod_names(cp, APP)) == 3 else None), 60,
                         "3 replicas")
        # Layer granularity, straight from the aggregated API, beside the plugin.
        streams = {n: ProgressStream(cp, n).start() for n in names}
        rc, out, err = finish(proc, 240)
        for s in streams.values():
            assert s.wait(60) == 0, s.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        for s in streams.values():
            s.stop()
        node.set_rate(None)
    assert rc == EXIT_OK, (out, err)
    assert "\x1b[" not in out, "not a terminal: plain lines expected"
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    assert {ln[0] for ln in lines} == {f"default/{n}" for n in names}, out
    assert all(ln[1] == "app" and ln[2] == image for ln in lines), out
    last = {ln[0]: ln for ln in lines}
    assert all(ln[3] in ("Done", "AlreadyPresent") for ln in last.values()), out
    # The first pull was watched while it moved: a line between 0 % and 100 %.
    partial = [ln for ln in lines if ln[3] == "Downloading"
               and (m := PCT.match(ln[4])) and 0 < int(m.group(1)) < 100]
    assert partial, out
    # Per layer: every pod's stream names each layer of the image and ends in a Summary;
    # the random layer's bytes grew in steps for the pod that downloaded it.
    big_digest, big_size = rollout_layers[-1]
    stepped = []
    for n, s in streams.items():
        objs = [o for _, o in s.objects]
        assert objs and objs[-1]["kind"] == "Summary", (n, objs[-3:])
        layers = {o.get("layer") for o in objs if o.get("kind") == "Progress"}
        assert {d for d, _ in rollout_layers} <= layers, (n, layers)
        seen = [int(o["progress"]) for o in objs
                if o.get("kind") == "Progress" and o.get("layer") == big_digest]
        assert seen == sorted(seen), (n, seen)
        if any(0 < p < big_size for p in seen):
            stepped.append(n)
    assert len(stepped) >= 1, "no pod showed partial progress of the 24 MiB layer"


def test_fail_fast_on_a_deployment_whose_image_does_not_exist(
        control_plane: ControlPlane, node: Node, real_node: Kubelet, plugin_bin: Path,
        cleanup: None) -> None:
    """``--fail-fast``: at the first failed pull the plugin stops with exit 1 (the
    documented "error" status) and an ``error: NAMESPACE/POD ...`` line."""
    cp = control_plane
    remove(cp, BROKEN)
    image = node.via_registry("aggapi-test/rollout-does-not-exist:1")
    cp.kubectl("apply", "-f", "-", input=json.dumps(deployment(BROKEN, node.name, image, 2)))
    t0 = time.monotonic()
    rc, out, err = finish(plugin(cp, plugin_bin, f"deployment/{BROKEN}", "--fail-fast"), 150)
    took = time.monotonic() - t0
    assert rc == EXIT_FAIL, (rc, out, err)
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert errors and all(ln.startswith(f"error: default/{BROKEN}-") for ln in errors), err
    assert "not found" in err or "BackOff" in err or "ErrImagePull" in err, err
    assert any(w in out for w in ("Failed", "BackOff")), out
    print(f"--fail-fast: exit {rc} after {took:.1f}s; {errors[0]}")
