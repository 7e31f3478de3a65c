"""A rollout on kwok's simulated Nodes with hollow agents, followed whole through the
real kube-apiserver and real kubectl (tests.framework.scale): correctness only, no
timing (benchmarks/bench_scale.py measures).

10 Nodes, 100 pods in two steps of 50, a share of first pulls failing (BackOff, then
a retry): every pod is listed by ``kubectl get podimagepulls -A`` with its node, every
pod reaches Done on ``kubectl get podimagepulls -A -w``, and the watches aggapi holds
on kube-apiserver are as many at 100 pods as at 50.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.framework.controlplane import ControlPlane
from tests.framework.procs import Proc
from tests.framework.scale import ScaleCluster, TableWatch

NODES = 10
STEP = 50
DONE_WITHIN = 150.0  # seconds: a hang, not a speed goal


@pytest.fixture(scope="module")
def scale(control_plane: ControlPlane, aggapi_apiserver: Proc) -> Iterator[ScaleCluster]:
    sc = ScaleCluster(control_plane, nodes=NODES, slots=4, namespaces=2,
                      fail_fraction=0.1, back_off=1.0)
    try:
        sc.start()
        yield sc
    finally:
        sc.stop()


def _watches(sc: ScaleCluster) -> tuple[float, float]:
    """(aggapi's collection watches, kube-apiserver's WATCHes on pods and events): the
    least of a few reads, so a watch being renewed at that moment does not count."""
    ours, kube = [], []
    for _ in range(3):
        ours.append(sc.aggapi_metrics().get("aggapi_apiserver_collection_watches", -1.0))
        w = sc.kube_watches()
        kube.append(w.get("pods", 0.0) + w.get("events", 0.0))
        time.sleep(1.0)
    return min(ours), min(kube)


def test_rollout_followed_whole_with_watches_independent_of_pods(
        scale: ScaleCluster) -> None:
    cp = scale.cp
    watch = TableWatch(cp)
    try:
        scale.create_pods(STEP)
        half = scale.pod_keys(STEP)
        assert watch.wait_done(half, DONE_WITHIN), \
            f"Done on the watch: {watch.done(half)}/{STEP}; phases {watch.phase}"
        at_half = _watches(scale)

        scale.create_pods(STEP)
        every = scale.pod_keys()
        assert watch.wait_done(every, DONE_WITHIN), \
            f"Done on the watch: {watch.done(every)}/{2 * STEP}"
        at_full = _watches(scale)
    finally:
        watch.stop()

    # One -A watch: the cluster-wide feed's pod and event watches, whatever the count.
    assert at_half[0] == at_full[0] == 2, (at_half, at_full)
    assert at_full[1] <= at_half[1], (at_half, at_full)

    # Every pod listed by real kubectl, on the node it is bound to.
    out = cp.kubectl("get", "podimagepulls", "-A", "--no-headers").stdout.splitlines()
    rows = {(c[0], c[1]): c for c in (line.split() for line in out)}
    for i in range(2 * STEP):
        key = (scale.namespace(i), f"app-{i}")
        assert key in rows, f"{key} not listed"
        assert rows[key][2] == scale.node_names[i % NODES], rows[key]
        assert rows[key][4] == "Done", rows[key]
    # Some first attempts failed and were retried: the BackOff was seen on the way.
    failed = [k for k in every if watch.seen_phases.get(k, set()) & {"BackOff", "Failed"}]
    assert failed, "no pod showed its failed first pull"
