"""Tenant isolation on the installed add-on (issue 24): tenant A abuses copy on a node
while tenant B, another namespace and user, copies on the same node.

Tenant A (namespace tenant-a, four pods) runs at once:
- slowloris uploads (10 B/s) on every pod, more than A's share of the node's slots;
- downloads of a 512 MiB file whose client never reads;
- an entry flood: tar uploads of 100,001 "./" entries (one over the limit), one after another;
- HEADs on an 8 GiB sparse file, each abandoned after 5 s.
Tenant B (namespace tenant-b, one pod on the same node) meanwhile downloads a small file
in a loop, uploads small files and downloads 64 MiB, as it did idle just before.

Wanted (the issue's "How"): B has 0 failures, B's small-download p95 <= 200 ms, B's
64 MiB download at >= 50% of its idle speed; A's slowloris copies are cut (the agent's
--copy-min-rate over --copy-rate-window) and A beyond its share gets 429. The figures,
idle and under attack, are printed with whether each goal is met; the test asserts
what does not depend on the machine's load (no failure for B, A's abuses refused or cut).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.addon.helpers import SLEEPER, MiB
from tests.e2e.addon.tenantapi import Api, _copy
from tests.e2e.addon.tenantattack import NS_A, RATE_WINDOW, Attack
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import pod_manifest

pytestmark = pytest.mark.e2e

NS_B = "tenant-b"
USER_A, USER_B = "tenant-a-user", "tenant-b-user"
PODS_A = [f"a{i}" for i in range(4)]
POD_B = "b0"
SMALL = os.urandom(1024)
BIG = 64 * MiB
P95_MAX = 0.200
SPEED_MIN = 0.5


def _tenant(cp: ControlPlane, ns: str, user: str, pods: list[str], node: str) -> None:
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    cp.add_user(user)
    cp.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": user, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "edit"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": user}]}])
    for p in pods:
        cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest(
            p, [{"name": "c", "image": SLEEPER, "command": ["sleep", "3600"]}], node=node,
            namespace=ns, pull_policy="Never")))
    cp.kubectl("-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=120s")


def _until_allowed(api: Api, target: str, body: bytes) -> None:
    """The apiservers cache authorization for a few seconds: wait for the new binding."""
    deadline = time.monotonic() + 60
    while True:
        status, data, _ = api.request("POST", target, body)
        if status == 200:
            return
        assert status == 403 and time.monotonic() < deadline, (status, data[:300])
        time.sleep(2)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


@dataclass
class Figures:
    latencies: list[float] = field(default_factory=list)
    uploads: list[float] = field(default_factory=list)
    big_mib_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        lat = self.latencies
        return (f"small download p50 {statistics.median(lat) * 1e3:.0f} ms, "
                f"p95 {_pct(lat, 0.95) * 1e3:.0f} ms, max {max(lat) * 1e3:.0f} ms "
                f"(n={len(lat)}); small upload p95 {_pct(self.uploads, 0.95) * 1e3:.0f} ms; "
                f"64 MiB download {self.big_mib_s:.1f} MiB/s; failures {len(self.failures)}")


def _measure_b(api: Api, seconds: float, big_digest: str) -> Figures:
    """B's copies for ``seconds``: small downloads (and a small upload every fifth), then
    one 64 MiB download."""
    f = Figures()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t = time.monotonic()
        status, data, _ = api.request("GET", _copy(NS_B, POD_B, "/tmp/small"))
        f.latencies.append(time.monotonic() - t)
        if status != 200 or data != SMALL:
            f.failures.append(f"GET small: {status} {data[:200]!r}")
        if i % 5 == 4:
            t = time.monotonic()
            status, data, _ = api.request("POST", _copy(NS_B, POD_B, f"/tmp/up{i}"), SMALL)
            f.uploads.append(time.monotonic() - t)
            if status != 200:
                f.failures.append(f"POST small: {status} {data[:200]!r}")
        i += 1
        time.sleep(0.05)
    t = time.monotonic()
    status, data, _ = api.request("GET", _copy(NS_B, POD_B, "/tmp/big"))
    took = time.monotonic() - t
    if status != 200 or hashlib.sha256(data).hexdigest() != big_digest:
        f.failures.append(f"GET big: {status} {len(data)} bytes")
    f.big_mib_s = len(data) / MiB / took
    return f


@pytest.fixture
def tenants(installed_addon: Addon, two_node_cluster: Cluster,
            tmp_path: Path) -> Iterator[tuple[Api, Api, str]]:
    cp = installed_addon.cp
    node = two_node_cluster.nodes[0].name
    try:
        _tenant(cp, NS_A, USER_A, PODS_A, node)
        _tenant(cp, NS_B, USER_B, [POD_B], node)
        a = Api(cp.user_kubeconfig(USER_A), tmp_path)
        b = Api(cp.user_kubeconfig(USER_B), tmp_path)
        _until_allowed(b, _copy(NS_B, POD_B, "/tmp/small"), SMALL)
        big = os.urandom(BIG)
        status, data, _ = b.request("POST", _copy(NS_B, POD_B, "/tmp/big"), big)
        assert status == 200, data[:300]
        _until_allowed(a, _copy(NS_A, PODS_A[0], "/tmp/probe"), b"x")
        for p in PODS_A:  # sparse: no disk, but a whole-file hash reads every byte
            exec_in_ns(cp, NS_A, p, "python3", "-c",
                       "for p, n in (('/tmp/huge', 512 << 20), ('/tmp/sparse', 8 << 30)):\n"
                       "    with open(p, 'wb') as f: f.truncate(n)")
        yield a, b, hashlib.sha256(big).hexdigest()
    finally:
        for ns in (NS_A, NS_B):
            cp.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false",
                       check=False)


def exec_in_ns(cp: ControlPlane, ns: str, pod: str, *cmd: str) -> str:
    return cp.kubectl("-n", ns, "exec", pod, "-c", "c", "--", *cmd).stdout


def _head_is_bounded(a: Api) -> bool:
    """Whether HEAD on a file over the size limit answers at once, without a digest
    (a 413 as its GET, since issue 35; before, a 200 without one)."""
    conn = a.connect(timeout=5)
    try:
        conn.request("HEAD", _copy(NS_A, PODS_A[3], "/tmp/sparse"))
        r = conn.getresponse()
        r.read()
        return r.status in (200, 413) and "Digest" not in r.headers
    except (http.client.HTTPException, OSError):
        return False
    finally:
        conn.close()


def test_tenant_b_copies_keep_working_while_tenant_a_abuses_copy(
        tenants: tuple[Api, Api, str]) -> None:
    a, b, big_digest = tenants
    cpu0, w0 = time.process_time(), time.time()
    idle = _measure_b(b, 10, big_digest)
    print(f"\ntenant B idle:         {idle.line()}")
    print(f"test process CPU idle: {time.process_time() - cpu0:.1f} s in "
          f"{time.time() - w0:.1f} s; window {w0:.0f}..{time.time():.0f}")

    attack = Attack(a)
    t_attack = time.monotonic()
    # A's share of the node's 8 slots is 4: the flood and two unread downloads take 3,
    # one slow upload the 4th, and the other slow uploads are refused.
    attack.spawn(attack.flood, PODS_A[2])
    if _head_is_bounded(a):
        attack.spawn(attack.head, PODS_A[3])
    else:  # hashing 8 GiB per HEAD would only measure this machine's two cores
        print("tenant A: HEAD attack left out: HEAD on an 8 GiB file still hashes it all "
              "(issue 24 finding 2, copy-isolation's fix)")
    time.sleep(1)
    for p in PODS_A[:2]:
        attack.spawn(attack.unread_download, p)
    time.sleep(1)
    for i, p in enumerate(PODS_A):
        attack.spawn(attack.slow_upload, p, 2 * i)
        attack.spawn(attack.slow_upload, p, 2 * i + 1)
    try:
        time.sleep(3)
        # This process's own CPU while B measures: the attack generator and B's client
        # share the machine's cores with aggapi, so its cost is reported with the figures.
        cpu0, b0, w0 = time.process_time(), time.thread_time(), time.time()
        loaded = _measure_b(b, 20, big_digest)
        cpu, b_cpu, wall = (time.process_time() - cpu0, time.thread_time() - b0,
                            time.time() - w0)
        print(f"tenant B under attack: {loaded.line()}")
        print(f"test process CPU under attack: {cpu:.1f} s in {wall:.1f} s "
              f"({cpu / wall:.0%} of a core; B's client {b_cpu:.1f} s, tenant A's "
              f"attack {cpu - b_cpu:.1f} s); window {w0:.0f}..{w0 + wall:.0f}")
        # Wait for the agent to cut the slow uploads and the unread downloads.
        deadline = t_attack + RATE_WINDOW * 2 + 20
        while time.monotonic() < deadline:
            with attack.lock:
                if len(attack.slow_uploads) == 8 and len(attack.unread) == 2:
                    break
            time.sleep(1)
    finally:
        attack.join()
    print(f"tenant A: slow uploads (status, s) {sorted(attack.slow_uploads)}")
    print(f"tenant A: unread 512 MiB downloads, bytes received {attack.unread}")
    print(f"tenant A: entry floods (status, s) {attack.floods}")
    print(f"tenant A: HEADs {attack.heads[:10]}{'...' if len(attack.heads) > 10 else ''}")
    idle_p95, loaded_p95 = _pct(idle.latencies, 0.95), _pct(loaded.latencies, 0.95)
    print(f"tenant B: p95 {idle_p95 * 1e3:.0f} -> {loaded_p95 * 1e3:.0f} ms, 64 MiB "
          f"{idle.big_mib_s:.1f} -> {loaded.big_mib_s:.1f} MiB/s "
          f"({loaded.big_mib_s / idle.big_mib_s:.0%} of idle)")

    assert idle.failures == [] and loaded.failures == [], loaded.failures[:5]
    statuses = [s for s, _ in attack.slow_uploads]
    assert 429 in statuses, statuses  # A beyond its share of the node's slots
    held = [(s, t) for s, t in attack.slow_uploads if s != 429]
    assert all(s != 200 and t < RATE_WINDOW * 2 + 10 for s, t in held), held  # cut
    assert len(attack.unread) == 2 and all(n < 512 * MiB for n in attack.unread), \
        attack.unread  # cut by the agent, not sent whole once read
    # Every flood is refused: 413 at its 100,001st entry, or 429 at once while A's
    # HEADs and uploads hold A's share of the node's copy slots (HEADs take theirs
    # per namespace since issue 35); at least one reaches the entry limit.
    floods = [st for st, _ in attack.floods]
    assert set(floods) <= {413, 429} and 413 in floods, (attack.floods, attack.flood_errors)
    # Timing goals are figures to report, not pass/fail (a test must not depend on how
    # busy this 2-core machine is): printed with whether each is met.
    print(f"goal: B's small-download p95 <= {P95_MAX * 1e3:.0f} ms under attack: "
          f"{'met' if loaded_p95 <= P95_MAX else 'NOT met'}")
    print(f"goal: B's 64 MiB copy >= {SPEED_MIN:.0%} of idle under attack: "
          f"{'met' if loaded.big_mib_s >= SPEED_MIN * idle.big_mib_s else 'NOT met'}")
