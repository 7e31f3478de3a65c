"""benchmarks/bench_progress_accuracy.py's measuring path, smoke-sized, on the real
kubelet of the e2e session: one short 5 MB/s scenario of three layers. It proves that
the bench's ground truth and readings hold together (the throttle recorded every byte of
every layer at the link's rate, the three granularities' streams ended with a Summary,
every layer, the image and the pod were scored at 25/50/75%), not that the goals are met:
that is the bench's own verdict, printed by ``python3 -m benchmarks.bench_progress_accuracy``.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks._accuracy_report import print_scenario
from benchmarks._accuracy_run import run_scenario
from benchmarks._accuracy_scenarios import Scenario
from benchmarks._accuracy_stacks import Stack, running_containerd
from tests.framework import oci
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node

SMOKE = Scenario("smoke-5m", (20, 10, 5), 5_000_000)


def test_accuracy_bench_scores_a_real_pull(control_plane: ControlPlane, node: Node,
                                           real_node: Kubelet, tmp_path: Path) -> None:
    stack = Stack(control_plane, False, node=node, kubelet=real_node,
                  containerd=running_containerd())
    r = run_scenario(stack, SMOKE, oci.BlobCache(tmp_path), nonce=f"{id(stack):x}")
    print_scenario(r)
    assert list(r["final_objects"].values()) == [
        {"layer": "Summary", "image": "Summary", "pod": "Summary"}]
    assert r["retried_blob_gets"] == 0
    # The throttle's own record: the whole link for this one pull, at its limit.
    assert 0.8 * SMOKE.rate <= r["link_real_rate"] <= 1.1 * SMOKE.rate, r["link_real_rate"]
    items = {(c["kind"], c["item"]) for c in r["checks"]}
    assert items == {("layer", "L1 20MiB"), ("layer", "L2 10MiB"), ("layer", "L3 5MiB"),
                     ("image", "image"), ("pod", "pod")}
    assert len(r["checks"]) == 3 * len(items)
    for c in r["checks"]:
        assert c["remaining_s"] > 0 and c["real_rate"] and c["real_rate"] > 0, c
        assert 0 <= c["eta_error"] and not math.isnan(c["eta_error"]), c
    s = r["summary"]
    assert not math.isnan(s["eta_error_median"]) and not math.isnan(s["rate_error_max"])
