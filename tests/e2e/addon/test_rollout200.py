"""A 200-replica rollout on the two real nodes, followed whole (issue 25's goal).

The installed add-on (helm, two apiserver replicas, an agent per node) serves
``podimagepulls``; kube-controller-manager makes the Deployment's 200 replicas,
kube-scheduler spreads them over both nodes and each node's real kubelet pulls the
image once through the throttle proxy (~1 min of pulling in all), the other replicas
finding it present. Two followers start before any pod exists, as users run them:

- ``kubectl get podimagepulls -l app=NAME -w -o json`` (real kubectl, through
  kube-apiserver and the aggregator);
- ``kubectl image-pull-progress deployment/NAME`` (kubectl finds the plugin on PATH;
  stdout a pipe: a line per change, the header on stderr at the end).

Both must see every one of the 200 pods from its creation to its image present (200 of
200 live, by pod name), on one of the two nodes, both nodes used, and nothing but
PodImagePulls on the watch. Printed, not asserted: the wall time of each stage and the
peak of the watches aggapi holds on kube-apiserver.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.addon.followers import PRESENT, Drained, JsonWatch
from tests.e2e.addon.helpers import kubectl_argv
from tests.e2e.addon.watchcounts import WatchCounts
from tests.framework import oci
from tests.framework.addon import Addon, wait_for
from tests.framework.cluster import Cluster
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import forget_images
from tests.framework.node import OCI_CACHE
from tests.plugins.helpers import KUBECTL, install_plugins, plugin_env

pytestmark = pytest.mark.e2e

APP, REPLICAS = "rollout-200", 200
IMAGE = "aggapi-test/rollout200:1"
KiB, MiB = 1 << 10, 1 << 20
LAYER = 6 * MiB  # on top of busybox's: each node downloads it once
RATE = 512 * KiB  # shared by both nodes' pulls: ~25 s of pulling in all
HEADER = re.compile(r"^(\d+) pods: (\d+) done, (\d+) pulling, (\d+) waiting for a slot, "
                    r"(\d+) stuck")
FOLLOW_TIMEOUT = 420.0


@pytest.fixture(scope="module")
def rollout_image(two_node_cluster: Cluster) -> str:
    """An image of its own (busybox, then a random layer no other test has), pushed to
    the cluster's registry; ``repository:tag``."""
    cache = oci.BlobCache(OCI_CACHE)
    image = oci.build_image([cache.busybox_layer(), cache.random_layer(LAYER, seed="r200")],
                            cmd=["/bin/busybox", "sleep", "3600"],
                            labels={"io.aggapi.test": "rollout200"})
    repo, tag = IMAGE.split(":")
    oci.push_image(two_node_cluster.registry.info.registry_host, repo, image, tag)
    return IMAGE


@pytest.fixture(scope="module")
def plugin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugins") / "bin"
    install_plugins(d)
    return d


def deployment(image: str, replicas: int) -> dict[str, Any]:
    """Tiny pods: no requests, nothing mounted, no DNS; gone as soon as deleted."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": APP}},
                 "template": {"metadata": {"labels": {"app": APP}}, "spec": {
                     "containers": [{"name": "app", "image": image,
                                     "imagePullPolicy": "IfNotPresent"}],
                     "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "dnsPolicy": "Default"}}}}


def live_pods(cp: ControlPlane) -> dict[str, str]:
    """The Deployment's pods not being deleted: name -> node ("" if unscheduled)."""
    out = json.loads(cp.kubectl("get", "pods", "-n", "default", "-l", f"app={APP}",
                                "-o", "json").stdout)
    return {str(p["metadata"]["name"]): str(p["spec"].get("nodeName") or "")
            for p in out.get("items") or [] if not p["metadata"].get("deletionTimestamp")}


def remove(cp: ControlPlane, timeout: float = 240) -> float:
    """Delete the Deployment and wait until none of its pods is left; seconds taken."""
    t0 = time.monotonic()
    cp.kubectl("delete", "deployment", APP, "-n", "default", "--ignore-not-found",
               "--wait=false", check=False)

    def gone() -> bool:
        r = cp.kubectl("get", "pods", "-n", "default", "-l", f"app={APP}", "-o", "name",
                       check=False)
        return r.returncode == 0 and not r.stdout.strip()

    wait_for(gone, timeout, f"the pods of {APP} gone")
    return time.monotonic() - t0


def listed_phases(cp: ControlPlane) -> dict[str, int]:
    """A fresh list's phases (whichever apiserver replica answers), for failure messages."""
    items = json.loads(cp.kubectl("get", "podimagepulls", "-n", "default", "-l", f"app={APP}",
                                  "-o", "json").stdout)["items"]
    return dict(Counter(str(o["status"]["phase"]) for o in items))


def start_watch(cp: ControlPlane) -> JsonWatch:
    """``kubectl get podimagepulls -w -o json`` watching (it lists, then watches from
    the list's resourceVersion), still running 5 s later.

    kubectl's list and watch may reach different apiserver replicas (the aggregator
    picks an endpoint per request). The watch must be served wherever it lands: by a
    replica whose feed was up at the list's version (a list's version is the state's
    as of the list), or whose feed started for this watch just after it (the state
    as events). A 410 here would end kubectl."""
    argv = kubectl_argv(cp, None, "get", "podimagepulls", "-n", "default", "-l",
                        f"app={APP}", "-w", "-o", "json")
    watch = JsonWatch(argv).start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and watch.proc is not None \
            and watch.proc.poll() is None:
        time.sleep(0.1)
    assert watch.proc is not None and watch.proc.poll() is None, watch.state()
    return watch


@pytest.fixture
def clean(installed_addon: Addon, two_node_cluster: Cluster) -> Iterator[None]:
    remove(installed_addon.cp)  # left by an interrupted run
    yield
    two_node_cluster.registry.set_rate(None)


def test_200_replicas_followed_whole_by_kubectl_watch_and_plugin(
        installed_addon: Addon, two_node_cluster: Cluster, rollout_image: str,
        plugin_bin: Path, clean: None, tmp_path: Path) -> None:
    a, cp, reg = installed_addon, installed_addon.cp, two_node_cluster.registry
    nodes = {n.name for n in two_node_cluster.nodes}
    for n in two_node_cluster.nodes:
        asyncio.run(forget_images(n.cri_address, rollout_image))
    image = reg.via_throttle(rollout_image)
    reg.set_rate(RATE)
    t0 = time.monotonic()
    # Zero replicas first: both followers are running before the first pod exists.
    cp.kubectl("apply", "-f", "-", input=json.dumps(deployment(image, 0)))
    counts = WatchCounts(a)  # its "before": no watch of this test's yet
    watch = start_watch(cp)
    plugin = Drained([KUBECTL, "image-pull-progress", f"deployment/{APP}", "-n", "default"],
                     plugin_env(plugin_bin, cp.admin_kubeconfig)).start()
    took: dict[str, float] = {}
    try:
        with counts:
            time.sleep(2)  # both have listed (nothing) and are watching
            cp.kubectl("scale", "deployment", APP, "-n", "default", f"--replicas={REPLICAS}")
            t_scale = time.monotonic()
            wait_for(lambda: len(live_pods(cp)) == REPLICAS, 120, f"{REPLICAS} pods made")
            took["pods made"] = time.monotonic() - t_scale
            if not plugin.wait(FOLLOW_TIMEOUT - took["pods made"]):
                out, err = plugin.stop()
                raise AssertionError(f"plugin still following after {FOLLOW_TIMEOUT:.0f}s:"
                                     f"\n{err[-2000:]}\n{out[-3000:]}")
            took["plugin done"] = time.monotonic() - t_scale

            def watched_all() -> bool:
                last = watch.latest()
                return len(last) >= REPLICAS and all(
                    o["status"]["phase"] in PRESENT for o in last.values())

            wait_for(watched_all, 60, "kubectl -w showing every pod's image present",
                     detail=lambda: f"{watch.state()}; a list now: {listed_phases(cp)}")
            took["watch done"] = time.monotonic() - t_scale
        pods = live_pods(cp)
    finally:
        out, err = plugin.stop()
        watch_rc, watch_err = watch.stop()
        # Kept for a failure's post-mortem.
        with (tmp_path / "kubectl-watch.ndjson").open("w") as f:
            f.writelines(f"{json.dumps([t, o])}\n" for t, o in watch.objects)
        (tmp_path / "plugin.out").write_text(out)
        (tmp_path / "plugin.err").write_text(err)
        reg.set_rate(None)
        took["teardown"] = remove(cp)
    took["all"] = time.monotonic() - t0

    assert plugin.proc is not None and plugin.proc.returncode == 0, (err[-3000:], out[-3000:])
    assert watch_rc is None, f"kubectl -w exited {watch_rc}: {watch_err}"
    assert len(pods) == REPLICAS and set(pods.values()) == nodes, pods

    # kubectl get -w: only PodImagePulls, every pod from creation (not yet present)
    # to its image present, on the node its Pod is bound to.
    kinds = {o.get("kind") for _, o in watch.objects}
    assert kinds == {"PodImagePull"}, kinds
    seen: dict[str, list[dict[str, Any]]] = {}
    for _, o in watch.objects:
        seen.setdefault(o["metadata"]["name"], []).append(o)
    assert set(seen) == set(pods), sorted(set(seen) ^ set(pods))
    for name, objs in seen.items():
        assert objs[0]["status"]["phase"] not in PRESENT, (name, objs[0]["status"])
        assert objs[-1]["status"]["phase"] in PRESENT, (name, objs[-1]["status"])
        assert objs[-1]["spec"]["nodeName"] == pods[name], (name, objs[-1]["spec"])
    bytes_seen = [o for objs in seen.values() for o in objs
                  if o["status"]["phase"] == "Downloading" and o["status"].get("progress")]
    assert bytes_seen, "no pod was seen downloading: the pull was not followed"

    # The plugin: one line per change, the last for each pod shows its image present.
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    first: dict[str, list[str]] = {}
    last: dict[str, list[str]] = {}
    for ln in lines:
        first.setdefault(ln[0], ln)
        last[ln[0]] = ln
    assert set(last) == {f"default/{n}" for n in pods}, sorted(set(last))[:5]
    assert all(ln[3] in PRESENT and ln[4] == "100%" for ln in last.values()), \
        [ln for ln in last.values() if ln[3] not in PRESENT][:5]
    assert all(ln[3] not in PRESENT for ln in first.values()), \
        [ln for ln in first.values() if ln[3] in PRESENT][:5]
    head = [m.groups() for ln in err.splitlines() if (m := HEADER.match(ln))]
    assert head and head[-1] == (str(REPLICAS), str(REPLICAS), "0", "0", "0"), err[-2000:]

    per_node = {n: sum(v == n for v in pods.values()) for n in sorted(nodes)}
    phases = {p: sum(objs[-1]["status"]["phase"] == p for objs in seen.values())
              for p in PRESENT}
    print(f"\nrollout of {REPLICAS}: pods per node {per_node}, {phases}; "
          f"{len(watch.objects)} objects on kubectl -w, {len(lines)} plugin lines; "
          + ", ".join(f"{k} {v:.1f}s" for k, v in took.items())
          + f"; peak watches aggapi holds on kube-apiserver {counts.aggapi_peak:.0f} "
          f"(kube-apiserver WATCH on pods+events {counts.kube_before:.0f} before, "
          f"peak {counts.kube_peak:.0f})")
