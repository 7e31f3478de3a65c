"""The upgrade path (issue 26, item 4): ``helm upgrade`` from the previous chart version to
this one, both from the OCI registry, fails no request.

The previous version is the chart of PREVIOUS_CHART_COMMIT (tests.framework.release),
published by hack/release.sh as PREVIOUS_CHART_VERSION next to this checkout's release,
with the same image by digest (no older image is built): what changes across the upgrade
is the chart, which rolls both workloads (the old one set CPU limits) and adds RBAC.

The session's add-on is uninstalled, the previous version installed in its place, then
``helm upgrade aggapi oci://.../charts/aggapi --version <current>`` while
tests.framework.rollout's Prober keeps sending requests through kube-apiserver: discovery,
each node's view, and for a pod on each node a progress snapshot (follow=false), an upload
and a download. Each of the last three carries a capability token: minted per agent call
by whichever replica answers (old or new), living at most 60 s, single use, and verified by
whichever agent serves the node (old or new): while both workloads roll, a token of an old
replica's key can meet a new agent and the reverse. What survives, as the chart makes it:
the TLS Secrets (helm ``lookup``) keep their bytes; the token keys are ephemeral, one per
replica, so every key rotates with its pod and no old replica's key is published after.
The add-on is left at the current version (installed again if anything failed).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import pytest

from tests.e2e.addon.helpers import delete_pods, run_pod
from tests.framework.addon import CHECKOUT_ARCHIVE, Addon
from tests.framework.cluster import Cluster
from tests.framework.procs import HarnessError
from tests.framework.release import (
    PREVIOUS_CHART_VERSION,
    Release,
    previous_chart,
    publish,
)
from tests.framework.rollout import Prober, pod_probes

pytestmark = pytest.mark.e2e


def _chart_version(a: Addon) -> str | None:
    r = a.helm("get", "metadata", a.release, "-n", a.namespace, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    version: str = json.loads(r.stdout)["version"]
    return version


def _cpu_limits(a: Addon) -> set[str | None]:
    return {c.get("resources", {}).get("limits", {}).get("cpu")
            for p in a.apiserver_pods() + a.pods("agent") for c in p["spec"]["containers"]}


def _tls(a: Addon) -> dict[str, dict[str, str]]:
    names = [f"{a.fullname}-{n}-tls" for n in ("apiserver", "agent", "agent-client")]
    return {n: a.get_json("secret", "-n", a.namespace, n)["data"] for n in names}


def _published_keys(a: Addon) -> dict[str, str]:
    """Owner pod uid -> key id of each published token key, found as an operator finds
    them: by the label the KEP documents (test_keys.py checks each key against its id)."""
    return {cm["metadata"]["ownerReferences"][0]["uid"]: cm["data"]["key-id"]
            for cm in a.get_json("configmaps", "-n", a.namespace,
                                 "-l=aggapi.io/token-key-set")["items"]}


def _serving_uids(a: Addon) -> set[str]:
    return {p["metadata"]["uid"] for p in a.apiserver_pods() if a.ready(p)}


def _pod_uids(a: Addon) -> set[str]:
    return {p["metadata"]["uid"] for p in a.apiserver_pods() + a.pods("agent")}


@pytest.fixture
def previous(installed_addon: Addon) -> Iterator[tuple[Addon, Release]]:
    """The previous chart version published, an Addon installing it; afterwards the
    session's add-on at its own version and Ready, whatever happened."""
    a = installed_addon
    assert a.published is not None and a.login is not None
    current = a.published
    t0 = time.monotonic()
    out = a.cp.state / "release-previous"
    prev = publish(a.login, CHECKOUT_ARCHIVE, out / "out", chart=previous_chart(out),
                   chart_version=PREVIOUS_CHART_VERSION)
    print(f"\nupgrade: previous chart {prev.chart} {prev.chart_version} published in "
          f"{time.monotonic() - t0:.1f}s")
    try:
        # Without the session's values: the previous chart's schema knows none of them.
        yield dataclasses.replace(a, published=prev, values=[]), current
    finally:
        a.published = current
        try:
            if _chart_version(a) != current.chart_version:
                raise HarnessError(f"release at {_chart_version(a)}")
            a.wait_ready(timeout=120)
        except HarnessError as e:
            print(f"upgrade: {e}; the session's add-on installed again")
            a.uninstall()
            a.install()


def test_helm_upgrade_from_the_previous_chart_fails_no_request(
        installed_addon: Addon, previous: tuple[Addon, Release],
        two_node_cluster: Cluster) -> None:
    a, (old, current) = installed_addon, previous
    cp = a.cp
    assert current.chart_version != PREVIOUS_CHART_VERSION
    names = {n.name: f"addon-upgrade-{n.k}" for n in two_node_cluster.nodes}
    for node, name in names.items():
        run_pod(cp, name, node, wait=False)
    try:
        t0 = time.monotonic()
        a.uninstall()
        times = old.install()
        print(f"upgrade: session add-on uninstalled, {PREVIOUS_CHART_VERSION} installed: "
              f"{times.line()} ({time.monotonic() - t0:.1f}s in all)")
        assert _chart_version(a) == PREVIOUS_CHART_VERSION
        assert _cpu_limits(a) == {"1", "500m"}  # the previous chart's own values
        for name in names.values():
            cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
        tls_before = _tls(a)
        keys_before = _published_keys(a)
        assert set(keys_before) == _serving_uids(a)
        pods_before = _pod_uids(a)
        probes = [p for name in names.values() for p in pod_probes("default", name, "c")]

        with Prober(cp, a.node_names(), extra=probes, workers=2) as probe:
            t1 = time.monotonic()
            a.upgrade()  # a.published: this checkout's release
            a.wait_ready(timeout=300)
            rolled = time.monotonic() - t1
            time.sleep(2)  # requests after the last old pod is gone
        r = probe.result
        print(f"upgrade: helm upgrade {PREVIOUS_CHART_VERSION} -> {current.chart_version} "
              f"rolled in {rolled:.1f}s; {r.line()}; sent {dict(r.sent)}")

        assert _chart_version(a) == current.chart_version
        assert _cpu_limits(a) == {None}
        assert not pods_before & _pod_uids(a), "every apiserver and agent pod replaced"
        assert not r.failures, r.failures[:10]
        assert r.unavailable_seconds == 0, r.line()
        # Every kind of request kept going through the roll (several per replica's life).
        assert min(r.sent[k] for k in ("discovery", "node view", "progress", "upload",
                                       "download")) >= 5, r.sent
        # Certificates survive: the Secrets helm generated keep their bytes (lookup).
        assert _tls(a) == tls_before
        # Token keys rotate: one new key per new replica, none of the old ones left.
        keys_after = _published_keys(a)
        assert set(keys_after) == _serving_uids(a)
        assert not set(keys_after.values()) & set(keys_before.values())
    finally:
        delete_pods(cp, *names.values())
