"""A real Prometheus scraping the installed add-on (issue 37's first goal).

Prometheus (tests.framework.prometheus) runs on the host and finds its targets as the
chart's ServiceMonitors make prometheus-operator find them: Kubernetes service
discovery of the EndpointSlices of the Services <fullname>-agent-metrics (port
``metrics``) and <fullname> (port ``https``, the apiservers, verified against their CA),
then HTTPS straight to each pod's IP (the host routes both nodes' pod CIDRs), with a
ServiceAccount token allowed only ``get /metrics``, and ``node`` from the pod's node.
Its rules are the chart's PrometheusRule groups rendered by helm, with
``prometheusRule.stalledFor`` set short. Through a throttled link of the test's own
(both nodes share it) one pod on each node pulls the big image, and a second pod on
node 1 waits for kubelet's one pull slot (serializeImagePulls). While they pull:

- in flight, per node: Prometheus' count is the node's own (its agent's NodeImagePulls
  view): 1 each; for the fleet (the leading apiserver's gauges): 2 pulls on 2 nodes, and
  1 image waiting, as the waiting pod's stream says (``Waiting``);
- each scraped sample of a node's bytes counter (less its value before the pull) is
  within one containerd step (1 MiB) of what the pod's progress stream showed then;
- the link paused (sockets open, no byte), AggapiImagePullStalled fires for both nodes
  within the agents' --pull-stall-seconds + its ``for:`` + a scrape and an evaluation
  (+ 1 s for the agent's poll).

Then the link runs free, every pull ends, and in flight and waiting go back to 0.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggapi.registrylabels import host_of_repository
from tests.e2e.addon.conftest import PULL_STALL_SECONDS
from tests.e2e.addon.helpers import MiB, RawStream, delete_pods, path, run_pod, until
from tests.framework.addon import CHART, Addon, wait_for
from tests.framework.cluster import Cluster
from tests.framework.controlplane import GROUP, VERSION
from tests.framework.kubelet import forget_images
from tests.framework.kubetools import binary
from tests.framework.node import throttle_for
from tests.framework.procs import HarnessError
from tests.framework.prometheus import Prometheus, Target, config

pytestmark = pytest.mark.e2e

SCRAPE = 1.0  # seconds: scrape and rule evaluation interval
STALLED_FOR = 2  # seconds: prometheusRule.stalledFor for this test
LINK = 2 * MiB  # bytes/s shared by both nodes' pulls: a step about every second on each
STEP = MiB  # containerd's progress step
COMPARE_SECONDS = 6.0
READER = "aggapi-e2e-prometheus"
ALERT = "AggapiImagePullStalled"
FLEET = "aggapi_apiserver_fleet_"


def rendered_rules(a: Addon) -> str:
    """The chart's PrometheusRule groups (what prometheus-operator hands Prometheus),
    rendered as the release has them but for the alert's ``for:``."""
    r = subprocess.run(
        [binary("helm"), "template", a.release, str(CHART), "-n", a.namespace,
         "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
         "--show-only", "templates/prometheusrule.yaml",
         "--set", "prometheusRule.enabled=true",
         "--set", f"prometheusRule.stalledFor={STALLED_FOR}s",
         "--set", f"agent.metrics.pullStallSeconds={PULL_STALL_SECONDS}"],
        capture_output=True, text=True, check=True, timeout=60)
    return yaml.safe_dump(yaml.safe_load(r.stdout)["spec"])


def reader_token(a: Addon) -> str:
    """A ServiceAccount allowed only ``get /metrics`` (as the chart's metrics-reader)."""
    ns = a.namespace
    a.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": READER, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": READER},
         "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": READER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": READER},
         "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": ns}]}]))
    return a.kubectl("create", "token", READER, "-n", ns, "--duration=1h").stdout.strip()


@pytest.fixture
def prometheus(installed_addon: Addon, tmp_path: Path) -> Iterator[Prometheus]:
    a = installed_addon
    d = tmp_path / "prom"
    d.mkdir()
    (d / "token").write_text(reader_token(a))
    ca = a.get_json("secret", "-n", a.namespace, f"{a.fullname}-apiserver-tls")["data"]
    (d / "apiserver-ca.crt").write_bytes(base64.b64decode(ca["ca.crt"]))
    agents = Target("aggapi-agent", a.namespace, f"{a.agent_name}-metrics", "metrics")
    apiservers = Target("aggapi-apiserver", a.namespace, a.fullname, "https",
                        ca_file=d / "apiserver-ca.crt",
                        server_name=f"{a.fullname}.{a.namespace}.svc")
    prom = Prometheus(d, config([agents, apiservers], kubeconfig=a.cp.admin_kubeconfig,
                                token_file=d / "token", interval=SCRAPE,
                                rule_files=["rules.yaml"]), {"rules.yaml": rendered_rules(a)})
    try:
        prom.start()
        until(lambda: len(prom.targets_up(agents.job)) == len(a.node_names())
              and prom.targets_up(apiservers.job), 30, "agents and apiservers scraped")
        yield prom
    except BaseException:
        print(prom.log())
        raise
    finally:
        prom.stop()
        a.kubectl("delete", "clusterrolebinding,clusterrole", READER, "--ignore-not-found",
                  check=False)
        a.kubectl("delete", "serviceaccount", READER, "-n", a.namespace,
                  "--ignore-not-found", check=False)


def by_node(prom: Prometheus, expr: str) -> dict[str, float]:
    return {r["metric"].get("node", ""): float(r["value"][1]) for r in prom.query(expr)}


def scalar(prom: Prometheus, expr: str) -> float | None:
    got = prom.query(expr)
    return float(got[0]["value"][1]) if got else None


def progress_at(stream: RawStream, t: float, window: float) -> list[int]:
    """The pod's progress as its stream showed it within ``window`` s of monotonic ``t``."""
    return [int(o.get("progress") or 0) for at, o in list(stream.objects)
            if abs(at - t) <= window and o.get("kind") == "Progress"
            and o.get("phase") == "Downloading"]


def phase(stream: RawStream) -> str:
    objs = [o for _, o in list(stream.objects) if o.get("kind") == "Progress"]
    return str(objs[-1].get("phase")) if objs else ""


def node_in_flight(a: Addon, node: str, registry: str) -> int | None:
    """The node's pulls in flight from ``registry`` (its view lists every pull; a
    lease with no repository yet, or left behind, has no registry)."""
    code, body = a.cp.get(f"/apis/{GROUP}/{VERSION}/nodes/{node}/imagepulls")
    assert code == 200, body
    pulls = json.loads(body).get("pulls")
    if not isinstance(pulls, list):
        return None
    return sum(1 for p in pulls
               if registry in {host_of_repository(r) for r in p.get("repositories") or ()})


def ours(prom: Prometheus, registry: str) -> list[dict[str, Any]]:
    """The stall alerts of ``registry`` (leases other than the test's pulls, e.g. with no
    repository, are another registry's: reported, not asserted on)."""
    return [x for x in prom.alerts()
            if x["labels"]["alertname"] == ALERT and x["labels"].get("registry") == registry]


def firing(prom: Prometheus, nodes: list[str], registry: str) -> list[dict[str, Any]] | None:
    got = [x for x in ours(prom, registry) if x["state"] == "firing"]
    return got if {x["labels"].get("node") for x in got} == set(nodes) else None


def test_prometheus_agrees_with_the_streams_and_fires_the_stall_alert(
        installed_addon: Addon, two_node_cluster: Cluster, prometheus: Prometheus) -> None:
    a, reg, prom = installed_addon, two_node_cluster.registry, prometheus
    cp = a.cp
    nodes = [n.name for n in two_node_cluster.nodes]
    registry = reg.bind  # containerd's distribution-source labels name no port
    tags = {n.name: reg.tag(reg.images.big, f"prom-{n.k}") for n in two_node_cluster.nodes}
    small = reg.tag(reg.images.busybox.split("/", 1)[1], "prom-waiting")
    pods = {n: f"addon-prom-{k}" for k, n in enumerate(nodes, 1)}
    queued = "addon-prom-waiting"  # on node 1, behind its big pull

    def forget() -> None:
        for n in two_node_cluster.nodes:
            asyncio.run(forget_images(n.cri_address, reg.images.big, small))

    forget()
    sel = f'registry="{registry}"'
    bytes_q = f"sum by (node) (aggapi_agent_image_pull_bytes_total{{{sel}}})"
    flight_q = f"sum by (node) (aggapi_agent_image_pulls_in_flight{{{sel}}})"
    fleet = {k: f"sum({FLEET}{k}{{{sel}}})" for k in (
        "image_pulls_in_flight", "nodes_pulling", "image_pulls_waiting")}
    before = by_node(prom, bytes_q)  # the counters as the session's pulls left them
    streams: dict[str, RawStream] = {}
    problems: list[str] = []  # every check runs; all that failed are reported at the end

    def check(ok: Callable[[], bool], timeout: float, what: str, seen: Any) -> bool:
        try:
            wait_for(ok, timeout, what, detail=lambda: f"last seen: {seen}")
            return True
        except HarnessError as e:
            problems.append(str(e))
            return False

    t_start = time.monotonic()
    with throttle_for(reg.info.registry_host,
                      [Path(n.info.containerd_dir) for n in two_node_cluster.nodes], LINK,
                      bind=reg.bind) as link:
        try:
            for node, pod in pods.items():
                run_pod(cp, pod, node, f"{link.host}/{tags[node]}", command=(),
                        pull_policy="IfNotPresent", wait=False)
                streams[node] = RawStream(cp, path("imagepullprogress", pod, watch=True,
                                                   granularity="pod")).start()
            until(lambda: all(progress_at(s, time.monotonic(), 60) for s in streams.values()),
                  60, "bytes in both pods' streams")
            run_pod(cp, queued, nodes[0], f"{link.host}/{small}",
                    command=("/bin/busybox", "sleep", "3600"), pull_policy="IfNotPresent",
                    wait=False)
            waiting = RawStream(cp, path("imagepullprogress", queued, watch=True,
                                         granularity="image")).start()
            streams["waiting"] = waiting

            # Counts: each node's own view, the streams, Prometheus (agents and fleet).
            seen: dict[str, Any] = {}

            def counts_agree() -> bool:
                seen.update(waiting=phase(waiting),
                            views={n: node_in_flight(a, n, registry) for n in nodes},
                            per_node=by_node(prom, flight_q),
                            fleet={k: scalar(prom, q) for k, q in fleet.items()},
                            fleet_series=[(r["metric"], r["value"][1]) for r in prom.query(
                                f'{{__name__=~"{FLEET}.*"}}')],
                            waiting_last=[o for _, o in list(waiting.objects)[-2:]])
                return (seen["waiting"] == "Waiting"
                        and all(seen["per_node"].get(n) == seen["views"][n] == 1
                                for n in nodes)
                        and seen["fleet"] == {"image_pulls_in_flight": len(nodes),
                                              "nodes_pulling": len(nodes),
                                              "image_pulls_waiting": 1})

            check(counts_agree, 15, "in flight 1 per node, 2 in the fleet, 1 waiting: in "
                                    "Prometheus, the node views and the streams", seen)

            # Bytes: every sample scraped meanwhile against the stream about then.
            time.sleep(COMPARE_SECONDS)
            compared, off = compare_bytes(prom, {n: streams[n] for n in nodes}, before, sel,
                                          t_start)
            if off or compared < 2 * len(nodes):
                problems.append(f"bytes: {compared} samples compared, off by more than a "
                                f"step: {off[:5]}")

            # Stall: the link pauses with every socket open.
            others = [x["labels"] for x in prom.alerts() if x["labels"]["alertname"] == ALERT
                      and x["labels"].get("registry") != registry]
            if others:
                print(f"\nprometheus: {ALERT} of other registries (not the test's): {others}")
            early = ours(prom, registry)
            if early:
                problems.append(f"{ALERT} before the pause: {early}")
            link.pause()
            paused = time.monotonic()
            alerts: dict[str, Any] = {}

            def fired() -> bool:
                alerts["now"] = [(x["labels"], x["state"]) for x in prom.alerts()]
                return bool(firing(prom, nodes, registry))

            if check(fired, 30, f"{ALERT} firing on both nodes", alerts):
                took = time.monotonic() - paused
                bound = PULL_STALL_SECONDS + STALLED_FOR + 2 * SCRAPE + 1
                got = firing(prom, nodes, registry) or []
                print(f"\nprometheus: {compared} samples within one step of the streams; "
                      f"{ALERT} firing {took:.1f}s after the pause (bound {bound:.0f}s): "
                      f"{[x['labels'] for x in got]}")
                if took > bound or {x["labels"]["registry"] for x in got} != {registry}:
                    problems.append(f"{ALERT} after {took:.1f}s (bound {bound}): {got}")

            link.resume()
            link.set_rate(None)
            until(lambda: all(s.wait_end(0) for s in streams.values()), 60, "every pull done")

            def idle() -> bool:
                seen.update(per_node=by_node(prom, flight_q),
                            fleet={k: scalar(prom, q) for k, q in fleet.items()})
                return (seen["per_node"] == {n: 0.0 for n in nodes}
                        and seen["fleet"] == dict.fromkeys(fleet, 0.0))

            check(idle, 15, "in flight and waiting back to 0", seen)
        finally:
            link.resume()
            link.set_rate(None)
            for s in streams.values():
                s.stop()
            delete_pods(cp, *pods.values(), queued)
    forget()
    assert not problems, "\n".join(problems)


def compare_bytes(prom: Prometheus, streams: dict[str, RawStream], before: dict[str, float],
                  sel: str, t_start: float) -> tuple[int, list[Any]]:
    """Each raw sample of the bytes counter since the pulls began, less its value before
    them, against the stream's progress about then: within one containerd step. The
    stream's receive times are monotonic; Prometheus' are wall clock."""
    offset = time.time() - time.monotonic()
    since = int(time.monotonic() - t_start) + 1
    compared, off = 0, []
    series = prom.samples(f"aggapi_agent_image_pull_bytes_total{{{sel}}}[{since}s]")
    if sorted(labels["node"] for labels, _ in series) != sorted(streams):
        return 0, [("series", [labels for labels, _ in series])]
    for labels, values in series:  # one series per node: its agent's counter
        node = labels["node"]
        for ts, v in values:
            got = v - before.get(node, 0.0)
            if got <= 0:
                continue  # before the first byte
            near = progress_at(streams[node], ts - offset, 1.5 * SCRAPE)
            if not near:
                continue
            if min(abs(got - p) for p in near) > STEP:
                off.append((node, got, near))
            compared += 1
    return compared, off
