"""How true are imagepullprogress's rates and ETAs (issue 23, item 5)?

A real kubelet pulls each scenario's image through containerd, from the harness registry
behind a bandwidth-limited link: a ThrottleProxy in this process (tests.framework.throttle),
which records when every blob byte left it. The progress is read as users read it:
``kubectl get --raw`` on the ``/watch/`` path of pods/P/imagepullprogress, through
kube-apiserver and the aggregator to the aggapi apiserver and agent, at layer, image and
pod granularity at once.

For each layer, image (its layers' blobs) and pod (its images' layers), at 25%, 50% and
75% of its bytes by the throttle's record (moment T), the latest object received before T
is compared with the truth:

- ETA error = |etaSeconds - (the item's last byte - T)| / (the item's last byte - T);
  no object yet, or a null/negative etaSeconds, counts as an error of 1.0 (100%);
- rate error = |bytesPerSecond - real| / real, real = the item's bytes that left the
  throttle in [T-2 s, T+2 s] (clipped to the item's first and last byte) over that window;
  not scored while the object says progress 0 and no rate (containerd has shown no byte of
  it yet, and no rate is made up).
  For an image or pod this is its share of the link (all of the link when it is alone);
- every Downloading object of every layer: its bytesPerSecond against the link's rate: its
  limit, or the rate its bytes really flowed at if higher, over the whole pull or over
  any 1 MiB (containerd's step): the throttle runs 0.5-3% over its limit (51 kB/s through
  50 kB/s) and sends its first 64 KiB at once (the first MiB at 53 kB/s).

Goals (issue 23): ETA error at 50% median <= 15% and p90 <= 30% over all scenarios;
image and pod rates within 15% of the real rate; no layer's rate above the link rate.

Every scenario pushes fresh random layers (a new seed each run), so nothing is cached.
containerd 2.x's transfer service moves the offset in 1 MiB steps, so small layers show
few steps. Scenario ``2pods-400k``: two pods on the node pull at once (kubelet restarted
with serializeImagePulls: false for it), sharing the link; each pod's real rate is its
share.

Two paths:

- the host-process harness (default): one node (host containerd), a real kubelet, the
  aggapi apiserver and agent as host processes;
- ``--cluster``: the path users run, hack/local-up.sh's two-node cluster
  (tests.framework.cluster: containerd 2.x, kubelet, kube-proxy per node) with aggapi
  installed by helm (tests.framework.addon: the agents DaemonSet pods from the image, the
  aggapi apiserver a Deployment). One throttle of the bench's own on the host bridge
  address, which both nodes' netns route to, is trusted by both nodes' containerd
  (certs.d hosts.toml, as the cluster trusts its registry: tests.framework.node
  throttle_for). Scenario ``2nodes-400k``: one pod pinned to each node (nodeName), each
  with its own image, pulling at once over the one link; each pod's real rate is its
  share. ``2nodes-400k-uneven``: node 2 pulls one 3 MiB layer, so its pull ends first and
  node 1's share grows then. Each node's agent sees only its node's pulls; the add-on is
  installed with ``apiserver.linkPeers=true``, so the leader, once it has measured that
  the nodes share the link (at a change of who pulls, or at a start together against
  the host's rate when one node pulled from it alone), tells each its peer's pull
  (issue 37 item 3). Both nodes start together: on a fresh install nothing can be
  judged before node 2's end; ``--rounds 2`` runs the scenario again after node 1's
  last seconds alone (``2nodes-400k-uneven-r2``). Single-pod 2.x scenarios run there
  too, on node 1.

    python3 -m benchmarks.bench_progress_accuracy [--up] [--cluster]
        [--scenario NAME ...] [--quick] [--rounds N] [--json FILE] [--instance NAME]

Without ``--up`` it uses the instance's running stack (default instance: local): for the
host path the control plane, node, real kubelet, aggapi apiserver and agent; a scenario for
another containerd than the running one is then skipped. With ``--cluster``, the running
cluster and helm release of hack/local-up.sh. With ``--up`` it brings up what it needs on
a private instance (accbench) and takes down at the end, by PID, only what it brought up:
for the host path containerd 2.x, then 1.6 for the 1.6 scenarios (AGGAPI_CONTAINERD); for
``--cluster`` the control plane and nodes as hack/local-up.sh does, this checkout's image
(hack/build-image.sh into an archive of its own) and ``helm install``.
Needs root and the binaries of hack/build-binaries.sh (kubelet, kube-proxy and helm
included).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.framework import nodestate, oci
from tests.framework.addon import CHECKOUT_ARCHIVE, Addon, addon_of, build_image, running_cluster
from tests.framework.cluster import Cluster, registry_of
from tests.framework.controlplane import INSTANCES, ControlPlane, binary
from tests.framework.kubelet import Kubelet, forget_images, pod_manifest
from tests.framework.node import Node, throttle_for
from tests.framework.procs import HarnessError, Proc, follow_json_lines
from tests.framework.repo import REPO
from tests.framework.throttle import ThrottleProxy

MiB = 1 << 20
FRACTIONS = (0.25, 0.5, 0.75)
WINDOW = 2.0  # real rate: the item's bytes in [T - WINDOW, T + WINDOW]
GV = "/apis/subresources.aggapi.io/v1alpha1"
# The leader tells nodes on one link their peers' pulls (--link-peers, issue 37 item 3).
LINK_PEERS = ["apiserver.linkPeers=true"]
GOAL_ETA_MEDIAN = 0.15
GOAL_ETA_P90 = 0.30
GOAL_RATE = 0.15

# (time s, cumulative bytes of the item), time rising: from the throttle's record.
ByteLog = list[tuple[float, float]]
# The throttle writes ~1/20 s of the link at a time: a sample's bytes went out over at
# most this long before it (not over a whole stall since the previous sample).
SPREAD = 0.25


def _spread_start(log: ByteLog, i: int) -> float:
    return max(log[i - 1][0], log[i][0] - SPREAD)


def bytes_at(log: ByteLog, t: float) -> float:
    """The item's bytes sent by time ``t``: 0 before its first sample, its count after
    its last; each later sample's bytes spread evenly over the SPREAD before it."""
    i = bisect.bisect_right([s for s, _ in log], t)
    if i == 0:
        return 0
    if i == len(log):
        return log[-1][1]
    a = _spread_start(log, i)
    n0, (t1, n1) = log[i - 1][1], log[i]
    return n0 if t <= a else n0 + (n1 - n0) * (t - a) / (t1 - a)


def merge_logs(logs: Sequence[ByteLog]) -> ByteLog:
    """The cumulative bytes of several items together (an image from its layers, a pod
    from its images), at every point where any of them changes pace."""
    points: set[float] = set()
    for log in logs:
        points.update(s for s, _ in log)
        points.update(_spread_start(log, i) for i in range(1, len(log)))
    return [(t, sum(bytes_at(log, t) for log in logs)) for t in sorted(points)]


def time_at_fraction(log: ByteLog, fraction: float) -> float:
    """When the item's bytes reached ``fraction`` of its final count (as :func:`bytes_at`
    spreads them)."""
    if not log:
        raise ValueError("empty byte log")
    target = fraction * log[-1][1]
    i = bisect.bisect_left([n for _, n in log], target)
    if i == 0:
        return log[0][0]
    i = min(i, len(log) - 1)
    a = _spread_start(log, i)
    n0, (t1, n1) = log[i - 1][1], log[i]
    return a + (t1 - a) * (target - n0) / (n1 - n0) if n1 > n0 else t1


def real_rate(log: ByteLog, t: float, window: float = WINDOW) -> float | None:
    """Bytes/s of the item over [t - window, t + window], clipped to its first and last
    byte (None if that leaves no time)."""
    start, end = log[0][0], log[-1][0]
    a, b = max(start, t - window), min(end, t + window)
    if b - a <= 1e-6:
        return None
    # At ``start`` the first sample's bytes are already out: count from just before.
    before = 0 if a <= start else bytes_at(log, a)
    return (bytes_at(log, b) - before) / (b - a)


def peak_rate(log: ByteLog, span: float = MiB) -> float:
    """The link's highest rate over any ``span`` bytes (a step of containerd's): the
    throttle sends its first chunk at once (its bucket goes into debt), so the first
    MiB of a pull arrives faster than the limit (53 kB/s through 50 kB/s)."""
    pts = [(log[0][0], 0.0), *log] if log else []
    best, j = 0.0, 0
    for i, (ti, ni) in enumerate(pts):
        j = max(j, i + 1)
        while j < len(pts) and pts[j][1] - ni < span:
            j += 1
        if j == len(pts):
            break
        if pts[j][0] > ti:
            best = max(best, (pts[j][1] - ni) / (pts[j][0] - ti))
    return best


def latest_before(objs: Sequence[tuple[float, dict[str, Any]]], t: float
                  ) -> dict[str, Any] | None:
    """The last object received before ``t`` (``objs`` in order of receipt)."""
    i = bisect.bisect_left([r for r, _ in objs], t)
    return objs[i - 1][1] if i else None


def eta_error(eta: Any, remaining: float) -> float:
    """|eta - remaining| / remaining; a missing (None, negative) ETA counts as 1.0."""
    if not isinstance(eta, int | float) or isinstance(eta, bool) or eta < 0:
        return 1.0
    return abs(float(eta) - remaining) / max(remaining, 1e-3)


def rate_error(reported: Any, real: float | None, progress: Any = None) -> float | None:
    """|reported - real| / real; a missing rate counts as 1.0; None if no real rate, or
    if the rate is missing while the item's reported progress is still 0: nothing has
    moved on the node yet, so there is nothing to measure (issue 23: no made-up rate)."""
    if real is None or real <= 0:
        return None
    if reported is None and progress == 0:
        return None
    if not isinstance(reported, int | float) or isinstance(reported, bool) or reported < 0:
        return 1.0
    return abs(float(reported) - real) / real


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile, q in [0, 1]."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Check:
    """One item at one fraction of its bytes."""

    kind: str  # layer | image | pod
    item: str
    fraction: float
    at: float
    remaining: float
    real_rate: float | None
    said_rate: Any
    said_eta: Any
    eta_error: float
    rate_error: float | None

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind, "item": self.item, "fraction": self.fraction,
                "remaining_s": round(self.remaining, 2),
                "real_rate": None if self.real_rate is None else round(self.real_rate),
                "said_rate": self.said_rate, "said_eta": self.said_eta,
                "eta_error": round(self.eta_error, 4),
                "rate_error": None if self.rate_error is None else round(self.rate_error, 4)}


def checks_for(kind: str, item: str, log: ByteLog,
               objs: Sequence[tuple[float, dict[str, Any]]]) -> list[Check]:
    """``item``'s checks at :data:`FRACTIONS`; ``objs`` its stream objects (receipt time,
    object) in order."""
    end = log[-1][0]
    out = []
    for f in FRACTIONS:
        t = time_at_fraction(log, f)
        o = latest_before(objs, t) or {}
        real = real_rate(log, t)
        out.append(Check(kind, item, f, t, end - t, real, o.get("bytesPerSecond"),
                         o.get("etaSeconds"), eta_error(o.get("etaSeconds"), end - t),
                         rate_error(o.get("bytesPerSecond"), real, o.get("progress"))))
    return out


def max_layer_rate(objs: Sequence[tuple[float, dict[str, Any]]]) -> float:
    """The highest bytesPerSecond any layer's Downloading object showed (0 if none)."""
    rates = [float(o["bytesPerSecond"]) for _, o in objs
             if o.get("kind") == "Progress" and o.get("layer")
             and o.get("phase") == "Downloading"
             and isinstance(o.get("bytesPerSecond"), int | float)]
    return max(rates, default=0.0)


def summarize(rows: Sequence[dict[str, Any]], layer_rate_over_link: float) -> dict[str, Any]:
    """Figures and goals of a set of checks (:meth:`Check.row`: a scenario's, or all),
    ``layer_rate_over_link`` the highest layer rate shown over the link's rate."""
    def etas(f: float) -> list[float]:
        return [float(r["eta_error"]) for r in rows if r["fraction"] == f]

    mid = etas(0.5)
    rates = [float(r["rate_error"]) for r in rows if r["kind"] in ("image", "pod")
             and r["rate_error"] is not None]
    out: dict[str, Any] = {
        "eta_error_median": quantile(mid, 0.5), "eta_error_p90": quantile(mid, 0.9),
        "rate_error_max": max(rates, default=math.nan),
        "layer_rate_over_link": layer_rate_over_link,
    }
    for f in (0.25, 0.75):
        out[f"eta_error_median_at_{int(f * 100)}"] = quantile(etas(f), 0.5)
        out[f"eta_error_p90_at_{int(f * 100)}"] = quantile(etas(f), 0.9)
    # NaN (nothing measured) compares False: a goal with no figure is not met.
    out["goals"] = {
        "eta_median": out["eta_error_median"] <= GOAL_ETA_MEDIAN,
        "eta_p90": out["eta_error_p90"] <= GOAL_ETA_P90,
        "rate": out["rate_error_max"] <= GOAL_RATE,
        "layer_rate_within_link": layer_rate_over_link <= 1.0,
    }
    out["goal_met"] = all(out["goals"].values())
    return out


# --- scenarios ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    layers_mib: tuple[float, ...]
    rate: int  # the link, bytes/s
    containerd: str = "2.x"
    pods: int = 1  # each with its own image of ``layers_mib``, pulled at once
    nodes: int = 1  # pod k on node (k-1) % nodes; more than one: the cluster path only
    # Pod k's own layers (k >= 2: other_pods_mib[k-2]) where they differ from layers_mib.
    other_pods_mib: tuple[tuple[float, ...], ...] = ()

    def layers(self, k: int) -> tuple[float, ...]:
        """Pod ``k``'s layers (MiB), k from 1."""
        return self.other_pods_mib[k - 2] if 2 <= k <= len(self.other_pods_mib) + 1 \
            else self.layers_mib

    @property
    def seconds(self) -> float:
        return sum(sum(self.layers(k)) for k in range(1, self.pods + 1)) * MiB / self.rate


SCENARIOS = [
    Scenario("l1-50k", (3,), 50_000),
    Scenario("l1-400k", (16,), 400_000),
    Scenario("l3-400k", (10, 6, 2), 400_000),
    Scenario("l6-400k", (8, 6, 4, 3, 2, 1), 400_000),
    Scenario("l1-5m", (100,), 5_000_000),
    Scenario("l3-5m", (60, 30, 15), 5_000_000),
    Scenario("l6-5m", (40, 25, 15, 12, 8, 5), 5_000_000),
    Scenario("2pods-400k", (8, 4), 400_000, pods=2),
    Scenario("l3-400k-ctd16", (10, 6, 2), 400_000, containerd="1.6"),
    Scenario("2nodes-400k", (8, 4), 400_000, pods=2, nodes=2),
    # Node 2's pull ends first: node 1's share of the link then grows, which nothing on
    # node 1 can see coming.
    Scenario("2nodes-400k-uneven", (8, 4), 400_000, pods=2, nodes=2, other_pods_mib=((3,),)),
]
QUICK = ("l3-5m",)
CLUSTER_DEFAULT = ("2nodes-400k", "2nodes-400k-uneven")
HOST_PATH = "host-process harness, 1 node"


def pick(names: Sequence[str] | None, *, quick: bool = False, cluster: bool = False
         ) -> list[Scenario]:
    """The scenarios to run: ``names``, else the smoke subset, else every scenario of the
    path (the cluster's own, or every one-node scenario on the host harness)."""
    default = (QUICK if quick else CLUSTER_DEFAULT if cluster
               else [s.name for s in SCENARIOS if s.nodes == 1])
    return [s for s in SCENARIOS if s.name in (names or default)]


# --- the stack ---------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"bench_progress_accuracy: {msg}", file=sys.stderr, flush=True)


def running_containerd() -> str:
    return "1.6" if os.environ.get("AGGAPI_CONTAINERD", "").startswith("1.6") else "2.x"


@dataclass
class Stack:
    """The host-process harness: one node (host containerd), a real kubelet, the aggapi
    apiserver and agent as host processes."""

    cp: ControlPlane
    up: bool
    node: Node | None = None
    kubelet: Kubelet | None = None
    containerd: str = ""
    started: list[Proc] = field(default_factory=list)
    path: str = HOST_PATH

    def bring_up(self, containerd: str) -> None:
        """Control plane (once), node with this containerd, real kubelet, aggapi."""
        if containerd == self.containerd:
            return
        if self.node is not None:
            self.take_down_node()
        os.environ["AGGAPI_CONTAINERD"] = containerd
        if not self.cp.proc("kube-apiserver").alive():
            subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                            "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                            "kubelet"], check=True, stdout=subprocess.DEVNULL)
            log(f"control plane up in {self.cp.up():.1f}s")
        self.node = Node(self.cp)
        log(f"node (containerd {containerd}) up in {self.node.start(agent=False):.1f}s")
        # kubelet before the agent: the agent reads the kubelet's config file.
        self.kubelet = Kubelet(self.cp, self.node)
        log(f"kubelet Ready in {self.kubelet.start():.1f}s")
        self.cp.start_apiserver()
        self.node.start_agent()
        self.containerd = containerd

    def take_down_node(self) -> None:
        assert self.node is not None
        self.node.stop_agent()
        if self.kubelet is not None:
            if self.kubelet.proc().alive():
                self.kubelet.delete_pods()
            self.kubelet.stop(all_sandboxes=True)
        self.node.stop()
        self.node = self.kubelet = None
        self.containerd = ""

    def attach(self) -> None:
        """The instance's running stack (no --up)."""
        if not nodestate.has_node(self.cp.state):
            raise SystemExit("no running node on this instance: hack/local-up.sh or --up")
        self.node = Node.load(self.cp)
        self.kubelet = Kubelet(self.cp, self.node)
        if not self.kubelet.proc().alive():
            raise SystemExit("no kubelet running on this instance: hack/local-up.sh or --up")
        self.containerd = running_containerd()

    def down(self) -> None:
        if self.node is not None:
            with contextlib.suppress(Exception):
                self.take_down_node()
        self.cp.down()

    # --- what a scenario needs (ClusterStack has the same) ------------------------------
    def cannot_run(self, sc: Scenario) -> str | None:
        if sc.nodes > 1:
            return "needs --cluster"
        if not self.up and sc.containerd != self.containerd:
            return f"containerd {sc.containerd} not running"
        return None

    def prepare(self, sc: Scenario) -> None:
        if self.up:
            self.bring_up(sc.containerd)

    @property
    def registry(self) -> Node:
        assert self.node is not None
        return self.node

    def placement(self, sc: Scenario) -> list[tuple[str, str]]:
        """Each pod's node: (Node name, its containerd's CRI address)."""
        assert self.node is not None
        return [(self.node.name, self.node.cri_address)] * sc.pods

    def link(self, rate: int) -> contextlib.AbstractContextManager[ThrottleProxy]:
        """A throttle of this process's own in front of the node's registry (so its record
        is readable here), on the host bridge address."""
        assert self.node is not None
        return self.node.own_throttle(rate, bind=self.node.bind)

    @contextlib.contextmanager
    def pulling_at_once(self, sc: Scenario) -> Iterator[None]:
        """Several pods share the link only if kubelet pulls their images at once."""
        kubelet = self.kubelet
        assert kubelet is not None
        serial = sc.pods > 1 and kubelet.serialize_image_pulls
        if serial:
            kubelet.restart(serialize_image_pulls=False)
        try:
            yield
        finally:
            if serial:
                kubelet.restart(serialize_image_pulls=True)


@dataclass
class ClusterStack:
    """The two-node cluster of hack/local-up.sh (tests.framework.cluster) with aggapi
    installed by helm (tests.framework.addon): the agents are DaemonSet pods from this
    checkout's image, the aggapi apiserver a Deployment. One throttle of the bench's own,
    on the host bridge address every node's netns routes to, trusted by both nodes'
    containerd: pods on both nodes share its link."""

    cp: ControlPlane
    up: bool
    cluster: Cluster | None = None
    addon: Addon | None = None
    containerd: str = "2.x"  # what tests.framework.cluster runs
    brought: list[str] = field(default_factory=list)  # what bring_up started, to take down
    path: str = ""

    def bring_up(self) -> None:
        """As hack/local-up.sh: control plane and two nodes, this checkout's image, helm
        install; whatever already runs is used as it is."""
        subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                        "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                        "kubelet", "kube-proxy", "helm"], check=True,
                       stdout=subprocess.DEVNULL)
        if not self.cp.proc("kube-apiserver").alive():
            self.brought.append("control plane")
            log(f"control plane up in {self.cp.up():.1f}s")
        if not nodestate.has_node(self.cp.state):
            self.brought.append("registry")
        cluster = self.cluster = Cluster(self.cp, registry_of(self.cp))
        if not cluster_ready(cluster):
            self.brought.append("cluster")
            log(f"{len(cluster.nodes)} nodes Ready in {cluster.up():.1f}s")
        addon = self.addon = addon_of(cluster)
        if addon.installed():
            log("add-on already installed: used as it is")
        else:
            log(f"image built or up to date in {build_image():.1f}s")
            log(f"image loaded in {addon.load_image(CHECKOUT_ARCHIVE):.1f}s")
            addon.remove_harness_objects()
            self.brought.append("add-on")
            log(addon.install(LINK_PEERS).line())
        self._describe()

    def attach(self) -> None:
        """The instance's running cluster and add-on (hack/local-up.sh; no --up)."""
        try:
            cluster = self.cluster = running_cluster(self.cp.instance)
        except HarnessError as err:
            raise SystemExit(f"{err} (or --up)") from err
        if not cluster_ready(cluster):
            raise SystemExit("the two-node cluster is not Ready: hack/local-up.sh or --up")
        addon = self.addon = addon_of(cluster)
        if not addon.installed() or not addon.available():
            raise SystemExit("no helm-installed aggapi serving: hack/local-up.sh or --up")
        self._describe()

    def _describe(self) -> None:
        assert self.cluster is not None and self.addon is not None
        self.path = (f"helm-installed add-on ({self.addon.image}), "
                     f"{len(self.cluster.nodes)} nodes")

    def down(self) -> None:
        """Only what bring_up started: the control plane takes everything along."""
        if "control plane" in self.brought:
            self.cp.down()
            return
        if "add-on" in self.brought and self.addon is not None:
            with contextlib.suppress(Exception):
                self.addon.uninstall()
        if "cluster" in self.brought and self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.down()
        if "registry" in self.brought and self.cluster is not None:
            self.cluster.registry.stop()

    def cannot_run(self, sc: Scenario) -> str | None:
        if sc.containerd != self.containerd:
            return f"the cluster runs containerd {self.containerd}"
        n = len(self.cluster.nodes) if self.cluster is not None else 2
        if sc.nodes > n or sc.pods > sc.nodes:
            # Two pods on one node pull at once only with serializeImagePulls false: a
            # kubelet restart this path does not make.
            return f"one pod per node, {n} nodes"
        return None

    def prepare(self, sc: Scenario) -> None:
        pass

    @property
    def registry(self) -> Node:
        assert self.cluster is not None
        return self.cluster.registry

    def placement(self, sc: Scenario) -> list[tuple[str, str]]:
        assert self.cluster is not None
        nodes = [self.cluster.nodes[k % sc.nodes] for k in range(sc.pods)]
        return [(n.name, n.cri_address) for n in nodes]

    def link(self, rate: int) -> contextlib.AbstractContextManager[ThrottleProxy]:
        assert self.cluster is not None
        reg = self.registry
        return throttle_for(reg.info.registry_host,
                            [Path(n.info.containerd_dir) for n in self.cluster.nodes], rate,
                            bind=reg.bind)

    def pulling_at_once(self, sc: Scenario) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # one pod per node: each kubelet pulls one image

    def server_logs(self) -> str:
        """Every aggapi apiserver replica's log so far, timestamped (the leader's link
        judgements are INFO lines of aggapi.apiserver.collections.linkshare)."""
        assert self.addon is not None
        out = []
        for p in self.addon.pods("apiserver"):
            name = p["metadata"]["name"]
            r = self.addon.kubectl("-n", self.addon.namespace, "logs", name, "--timestamps",
                                   check=False)
            out.append(f"--- {name}\n{r.stdout}{r.stderr}")
        return "\n".join(out)


def cluster_ready(cluster: Cluster) -> bool:
    """Every node's kubelet running and Ready, every kube-proxy synced (as local-up asks)."""
    return all(n.kubelet.proc().alive() and n.ready() and n.kube_proxy.healthy()
               for n in cluster.nodes)


@dataclass
class Stream:
    """``kubectl get --raw`` of the /watch/ path at one granularity: (wall time, object)."""

    cp: ControlPlane
    pod: str
    granularity: str
    objects: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    def start(self) -> Stream:
        path = (f"{GV}/watch/namespaces/default/pods/{self.pod}/imagepullprogress"
                f"?granularity={self.granularity}")
        self.proc = subprocess.Popen(
            [binary("kubectl"), f"--kubeconfig={self.cp.admin_kubeconfig}", "get", "--raw",
             path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        follow_json_lines(self.proc, self.objects, clock=time.time)
        return self

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class PodRun:
    """One pod of a scenario: its image (fresh layers) and its three streams."""

    name: str
    ref: str  # as the pod spec names it (through the link)
    repo_tag: str
    blobs: list[oci.Blob]
    streams: dict[str, Stream] = field(default_factory=dict)


def push(node: Node, cache: oci.BlobCache, sc: Scenario, nonce: str, k: int
         ) -> tuple[str, list[oci.Blob]]:
    layers = [cache.random_layer(int(m * MiB), seed=f"acc-{sc.name}-{nonce}-{k}-{i}")
              for i, m in enumerate(sc.layers(k))]
    # A runnable container: a start failure is a kubelet "Failed" event, which would end
    # the streams early. The base is the sandbox (pause) image's own layer, from the
    # registry node's cache: already in every node's containerd (each runs pods), so it is
    # never fetched and only the random layers move.
    base = oci.BlobCache(node.cache_dir).busybox_layer()
    image = oci.build_image([base, *layers], cmd=["/bin/busybox", "sleep", "3600"],
                            labels={"io.aggapi.test": f"accuracy-{sc.name}"})
    repo = f"aggapi-bench/accuracy-{sc.name}-{k}"
    oci.push_image(node.info.registry_host, repo, image, nonce)
    return f"{repo}:{nonce}", [la.blob for la in layers]


def run_scenario(stack: Stack | ClusterStack, sc: Scenario, cache: oci.BlobCache, nonce: str
                 ) -> dict[str, Any]:
    cp, registry = stack.cp, stack.registry
    pushed = [push(registry, cache, sc, nonce, k) for k in range(1, sc.pods + 1)]
    names = [f"acc-{sc.name}-{k}" for k in range(1, sc.pods + 1)]
    where = stack.placement(sc)
    cp.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--ignore-not-found",
               check=False)
    timeout = 3 * sc.seconds + 90
    try:
        with stack.pulling_at_once(sc), stack.link(sc.rate) as proxy:
            pods = [PodRun(n, f"{proxy.host}/{rt}", rt, blobs)
                    for n, (rt, blobs) in zip(names, pushed, strict=True)]
            cp.kubectl("create", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "List", "items": [pod_manifest(
                    p.name, [{"name": "c", "image": p.ref}], node=node)
                    for p, (node, _) in zip(pods, where, strict=True)]}))
            for p in pods:
                p.streams = {g: Stream(cp, p.name, g).start()
                             for g in ("layer", "image", "pod")}
            streams = [s for p in pods for s in p.streams.values()]
            t0 = time.monotonic()
            try:
                while not all(s.ended() for s in streams):
                    if time.monotonic() - t0 > timeout:
                        log(f"{sc.name}: streams still open after {timeout:.0f}s")
                        break
                    time.sleep(0.5)
            finally:
                for s in streams:
                    s.stop()
            record = proxy.blob_log()
    finally:
        cp.kubectl("delete", "pod", *names, "--grace-period=0", "--force",
                   "--ignore-not-found", check=False)
    for p, (_, cri) in zip(pods, where, strict=True):
        with contextlib.suppress(Exception):
            asyncio.run(forget_images(cri, p.repo_tag))
    r = evaluate(sc, pods, record)
    r["path"] = stack.path
    r["nodes"] = [node for node, _ in where]
    return r


def evaluate(sc: Scenario, pods: Sequence[PodRun], record: dict[str, Any]) -> dict[str, Any]:
    checks: list[Check] = []
    retries = 0
    finals: dict[str, dict[str, Any]] = {}
    objects: dict[str, dict[str, int]] = {}
    link_logs: list[ByteLog] = []
    layer_max = 0.0
    for p in pods:
        k = int(p.name.rsplit("-", 1)[1])
        tag = f"p{k} " if len(pods) > 1 else ""
        logs: list[ByteLog] = []
        for b in p.blobs:
            fetches = record.get(b.digest) or []
            done = [f for f in fetches if f.received == b.size]
            retries += max(0, len(fetches) - 1)
            if not done:
                raise RuntimeError(f"{sc.name}: blob {b.digest[:19]} never fully sent "
                                   f"({[f.received for f in fetches]} of {b.size})")
            # The attempt that finished is the one the pull's progress ends with.
            logs.append([(wall, float(n)) for _, wall, n in done[-1].samples])
        got = {g: s.objects for g, s in p.streams.items()}
        progress = {g: [(t, o) for t, o in objs if o.get("kind") == "Progress"]
                    for g, objs in got.items()}
        finals[p.name] = {g: next((o.get("kind") for _, o in reversed(objs)
                                   if o.get("kind") != "Progress"), None)
                          for g, objs in got.items()}
        objects[p.name] = {g: len(v) for g, v in got.items()}
        for i, (b, lg) in enumerate(zip(p.blobs, logs, strict=True)):
            objs = [(t, o) for t, o in progress["layer"] if o.get("layer") == b.digest]
            checks += checks_for("layer", f"{tag}L{i + 1} {sc.layers(k)[i]:g}MiB", lg, objs)
        image_log = merge_logs(logs)
        # One image per pod: its objects are the image stream's (named as the spec does).
        image_objs = [(t, o) for t, o in progress["image"] if o.get("image") == p.ref]
        checks += checks_for("image", f"{tag}image", image_log, image_objs)
        checks += checks_for("pod", f"{tag}pod", image_log, progress["pod"])
        link_logs.append(image_log)
        layer_max = max(layer_max, max_layer_rate(progress["layer"]))
    rows = [c.row() for c in checks]
    if dump := os.environ.get("BENCH_ACC_DUMP"):
        # Every object received and the throttle's record, for a closer look ("{scenario}"
        # in the name: one file per scenario).
        Path(dump.replace("{scenario}", sc.name)).write_text(json.dumps({
            "pods": {p.name: {g: s.objects for g, s in p.streams.items()} for p in pods},
            "logs": {b.digest: [(w, n) for _, w, n in (record.get(b.digest) or [])[-1].samples]
                     for p in pods for b in p.blobs}}, default=str))
    link_log = merge_logs(link_logs)
    all_bytes = link_log[-1][1]
    seconds = link_log[-1][0] - link_log[0][0]
    link_rate = max(float(sc.rate), all_bytes / seconds if seconds > 0 else 0.0,
                    peak_rate(link_log))
    return {"scenario": sc.name, "pods": sc.pods,
            "layers_mib": [list(sc.layers(k)) for k in range(1, sc.pods + 1)]
            if sc.other_pods_mib else list(sc.layers_mib),
            "link_rate": sc.rate, "containerd": sc.containerd,
            "pull_seconds": round(seconds, 2),
            "link_real_rate": round(all_bytes / seconds) if seconds > 0 else None,
            "retried_blob_gets": retries, "final_objects": finals, "objects": objects,
            "layer_rate_max": layer_max,
            "summary": summarize(rows, layer_max / link_rate),
            "checks": rows}


# --- output ------------------------------------------------------------------------------

def fmt_rate(v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "null"
    return f"{v / 1000:.0f}k" if v < 1e6 else f"{v / 1e6:.2f}M"


def fmt_eta(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) and not isinstance(v, bool) else "null"


def pct(v: float | None) -> str:
    return "  n/a" if v is None or math.isnan(v) else f"{v:5.0%}"


def print_scenario(r: dict[str, Any]) -> None:
    print(f"\n== {r['scenario']}: {r['pods']} pod(s) on {r['nodes']}, layers "
          f"{r['layers_mib']} MiB, link {fmt_rate(r['link_rate'])}B/s, "
          f"containerd {r['containerd']}, {r['path']}; bytes flowed "
          f"{r['pull_seconds']} s at "
          f"{fmt_rate(r['link_real_rate'])}B/s; retried blob GETs {r['retried_blob_gets']}; "
          f"objects {r['objects']}; final {r['final_objects']}")
    print(f"{'item':17} {'at':>4} {'rate said':>9} {'real±2s':>8} {'err':>5}  "
          f"{'ETA said':>8} {'real left':>9} {'err':>5}")
    for c in r["checks"]:
        print(f"{c['kind'][:5] + ' ' + c['item']:17.17} {c['fraction']:4.0%} "
              f"{fmt_rate(c['said_rate']):>9} {fmt_rate(c['real_rate']):>8} "
              f"{pct(c['rate_error'])}  {fmt_eta(c['said_eta']):>8} "
              f"{c['remaining_s']:9.1f} {pct(c['eta_error'])}")
    print_summary(r["summary"], f"{r['scenario']}; max layer rate {fmt_rate(r['layer_rate_max'])}"
                  f"B/s")


def print_summary(s: dict[str, Any], label: str) -> None:
    g = s["goals"]

    def ok(b: bool) -> str:
        return "met" if b else "NOT met"

    print(f"-- {label}: ETA error at 50% median {pct(s['eta_error_median'])} (goal <= 15%: "
          f"{ok(g['eta_median'])}), p90 {pct(s['eta_error_p90'])} (goal <= 30%: "
          f"{ok(g['eta_p90'])}); at 25% median {pct(s['eta_error_median_at_25'])} p90 "
          f"{pct(s['eta_error_p90_at_25'])}, at 75% median {pct(s['eta_error_median_at_75'])}"
          f" p90 {pct(s['eta_error_p90_at_75'])}; image/pod rate error max "
          f"{pct(s['rate_error_max'])} (goal <= 15%: {ok(g['rate'])}); max layer rate / link "
          f"{s['layer_rate_over_link']:.2f} (goal <= 1: {ok(g['layer_rate_within_link'])})"
          f" -> goals {ok(s['goal_met'])}")


def overall(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [c for r in results for c in r["checks"]]
    over = max((float(r["summary"]["layer_rate_over_link"]) for r in results),
               default=math.nan)
    return summarize(rows, over)


def finite(v: Any) -> Any:
    """JSON has no NaN: nothing measured is null."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_progress_accuracy",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--up", action="store_true",
                   help="bring the stack up first, take it down at the end")
    p.add_argument("--instance", default=None,
                   help="control plane instance (default: local; with --up, a private one)")
    p.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS],
                   help="run only this scenario (repeatable)")
    p.add_argument("--quick", action="store_true", help=f"smoke subset: {', '.join(QUICK)}")
    p.add_argument("--cluster", action="store_true",
                   help="on the two-node cluster with the helm-installed add-on (default "
                        f"scenarios: {', '.join(CLUSTER_DEFAULT)})")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="run each scenario N times in a row, fresh layers each time; "
                        "round k >= 2 is reported as NAME-rk (on the cluster, round 1 is "
                        "the first pull of the host the leader sees; round 2 follows "
                        "round 1, whose last seconds one node pulled alone)")
    a = p.parse_args(argv)
    chosen = pick(a.scenario, quick=a.quick, cluster=a.cluster)
    instance = a.instance or ("accbench" if a.up else
                              os.environ.get("AGGAPI_INSTANCE", "local"))
    if instance not in INSTANCES:  # a private instance: a subnet of its own
        INSTANCES[instance] = max(INSTANCES.values()) + 1
    cp = ControlPlane(instance=instance)
    stack: Stack | ClusterStack = ClusterStack(cp, a.up) if a.cluster else Stack(cp, a.up)
    # Stopped (timeout, kill): unwind, so --up takes down what it brought up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    nonce = f"{int(time.time())}"
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    try:
        if isinstance(stack, ClusterStack) and a.up:
            stack.bring_up()
        elif not a.up:
            stack.attach()
        (REPO / ".local").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="bench-acc-", dir=REPO / ".local") as d:
            cache = oci.BlobCache(Path(d))
            # 2.x scenarios first, then 1.6: one node restart at most.
            runs = [sc if k == 1 else replace(sc, name=f"{sc.name}-r{k}")
                    for sc in chosen for k in range(1, a.rounds + 1)]
            for sc in sorted(runs, key=lambda s: s.containerd != "2.x"):
                if why := stack.cannot_run(sc):
                    log(f"{sc.name}: skipped ({why})")
                    skipped.append(sc.name)
                    continue
                stack.prepare(sc)
                log(f"{sc.name}: {sc.layers_mib} MiB at {sc.rate} B/s "
                    f"(~{sc.seconds:.0f}s of bytes) on {stack.path}")
                r = run_scenario(stack, sc, cache, nonce)
                if (dump := os.environ.get("BENCH_ACC_DUMP")) and isinstance(stack,
                                                                          ClusterStack):
                    Path(dump.replace("{scenario}", sc.name) + ".apiserver.log").write_text(
                        stack.server_logs())
                print_scenario(r)
                results.append(r)
    finally:
        if a.up:
            stack.down()
    total = overall(results)
    print()
    print_summary(total, f"overall ({len(results)} scenarios"
                  + (f"; skipped {skipped}" if skipped else "") + ")")
    print(f"{'scenario':15} {'ETA50 med':>9} {'p90':>5} {'rate max':>8} {'layer/link':>10}  goals")
    for r in results:
        s = r["summary"]
        print(f"{r['scenario']:15} {pct(s['eta_error_median']):>9} {pct(s['eta_error_p90'])} "
              f"{pct(s['rate_error_max']):>8} {s['layer_rate_over_link']:10.2f}  "
              f"{'met' if s['goal_met'] else 'NOT met'}")
    if a.json:
        a.json.write_text(json.dumps(finite({
            "eta_error_median": total["eta_error_median"],
            "eta_error_p90": total["eta_error_p90"],
            "rate_error_max": total["rate_error_max"], "goal_met": total["goal_met"],
            "overall": total, "skipped": skipped,
            "scenarios": {r["scenario"]: r for r in results}}), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
