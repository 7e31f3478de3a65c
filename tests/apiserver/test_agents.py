from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.agents import AgentDirectory, endpoints_from_slice, refusal
from aggapi.status import StatusError
from tests.framework.fakekube import FakeKube


def test_only_ready_endpoints_with_node_names() -> None:
    es = {
        "ports": [{"name": "https", "port": 10443}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "nodeName": "a", "conditions": {"ready": True}},
            {"addresses": ["10.0.0.2"], "nodeName": "b", "conditions": {"ready": False}},
            {"addresses": ["10.0.0.3"], "nodeName": "c", "conditions": {}},
            {"addresses": ["10.0.0.4"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.5"], "nodeName": "e",
             "conditions": {"ready": True, "terminating": True}},
        ],
    }
    eps = endpoints_from_slice(es, "https")
    assert [(e.node, e.url) for e in eps] == [("a", "https://10.0.0.1:10443"),
                                              ("c", "https://10.0.0.3:10443")]


def test_port_by_name_and_ipv6() -> None:
    es = {"ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 1}],
          "endpoints": [{"addresses": ["fd00::1"], "nodeName": "a"}]}
    assert endpoints_from_slice(es, "https")[0].url == "https://[fd00::1]:1"
    assert endpoints_from_slice(es, "grpc") == []


# --- only the agent DaemonSet's pod on the node counts ---------------------------------

NS, DS = "aggapi", "aggapi-agent"


def _pod(name: str, node: str, ip: str, *, uid: str | None = None, owner: str = DS,
         kind: str = "DaemonSet", controller: bool = True, api: str = "apps/v1",
         deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid or f"uid-{name}",
                            "ownerReferences": [{"apiVersion": api, "kind": kind,
                                                 "name": owner, "uid": "ds-uid",
                                                 "controller": controller}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node}, "status": {"podIP": ip, "podIPs": [{"ip": ip}]}}


def _entry(pod: str, node: str, ip: str, uid: str | None = None,
           kind: str = "Pod", ns: str = NS) -> dict[str, Any]:
    return {"addresses": [ip], "nodeName": node, "conditions": {"ready": True},
            "targetRef": {"kind": kind, "name": pod, "namespace": ns,
                          "uid": uid or f"uid-{pod}"}}


def _slice(*entries: dict[str, Any], name: str = "aggapi-agent-x") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": DS}},
            "addressType": "IPv4", "endpoints": list(entries),
            "ports": [{"name": "https", "port": 10443}]}


# Each way an entry can fail to be the DaemonSet's pod on its node, as a change to a
# (pod, entry) pair that is.
FAULTS: dict[str, Any] = {
    "no targetRef": lambda p, e: e.pop("targetRef"),
    "targetRef not a pod": lambda p, e: e["targetRef"].update(kind="Node"),
    "targetRef in another namespace": lambda p, e: e["targetRef"].update(namespace="x"),
    "no such pod": lambda p, e: e["targetRef"].update(name="ghost"),
    "pod uid differs (recreated)": lambda p, e: p["metadata"].update(uid="other"),
    "owned by another DaemonSet": lambda p, e: p["metadata"]["ownerReferences"][0].update(
        name="evil"),
    "owned by a ReplicaSet": lambda p, e: p["metadata"]["ownerReferences"][0].update(
        kind="ReplicaSet"),
    "owner is not the controller": lambda p, e: p["metadata"]["ownerReferences"][0].update(
        controller=False),
    "no owner": lambda p, e: p["metadata"].pop("ownerReferences"),
    "pod on another node": lambda p, e: p["spec"].update(nodeName="n2"),
    "address not the pod's": lambda p, e: e.update(addresses=["10.9.9.9"]),
    "pod being deleted": lambda p, e: p["metadata"].update(
        deletionTimestamp="2026-01-01T00:00:00Z"),
}


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(sorted(FAULTS))))
def test_an_entry_counts_iff_it_is_the_daemonsets_pod_on_its_node(faults: set[str]) -> None:
    pod, entry = _pod("agent-a", "n1", "10.0.0.1"), _entry("agent-a", "n1", "10.0.0.1")
    # Removals last, so every change finds what it changes.
    for f in sorted(faults, key=lambda f: (f in ("no targetRef", "no owner"), f)):
        FAULTS[f](pod, entry)
    (ep,) = endpoints_from_slice(_slice(entry), "https")
    why = refusal(ep, {"agent-a": pod}, namespace=NS, daemonset=DS)
    assert (why is None) == (not faults), (faults, why)


async def _directory(kube: FakeKube) -> AgentDirectory:
    d = AgentDirectory(kube.kube_client(), namespace=NS, service=DS)
    d.start()
    await asyncio.wait_for(_until(lambda: d.synced), 5)
    return d


async def _stop(d: AgentDirectory) -> None:
    await d.stop()
    await d._informer._kube.close()


async def _until(pred: Any) -> None:
    while not pred():  # noqa: ASYNC110 - polling a plain predicate
        await asyncio.sleep(0.02)


async def test_directory_refuses_endpoints_not_owned_by_the_daemonset_pod() -> None:
    kube = FakeKube()
    await kube.start()
    try:
        # n1: the real agent. n2: an impostor pod (not the DaemonSet's) in the slice.
        # n3: node n1's agent pod listed under node n3 (a node's agent claiming another).
        kube.put("api/v1", "pods", _pod("agent-a", "n1", "10.0.0.1"))
        kube.put("api/v1", "pods", _pod("impostor", "n2", "10.0.0.2", owner="other",
                                        kind="ReplicaSet"))
        kube.put("apis/discovery.k8s.io/v1", "endpointslices", _slice(
            _entry("agent-a", "n1", "10.0.0.1"), _entry("impostor", "n2", "10.0.0.2"),
            _entry("agent-a", "n3", "10.0.0.1")))
        d = await _directory(kube)
        try:
            await asyncio.wait_for(_until(lambda: "n1" in d.nodes()), 5)
            assert d.lookup("n1").url == "https://10.0.0.1:10443"
            for node in ("n2", "n3"):
                with pytest.raises(StatusError) as err:
                    d.lookup(node)
                assert err.value.code == 503
            # The DaemonSet's pod on n2 appears: n2 is served by it, not the impostor.
            kube.put("api/v1", "pods", _pod("agent-b", "n2", "10.0.0.3"))
            kube.put("apis/discovery.k8s.io/v1", "endpointslices", _slice(
                _entry("agent-b", "n2", "10.0.0.3"), name="aggapi-agent-y"))
            await asyncio.wait_for(_until(lambda: "n2" in d.nodes()), 5)
            assert d.lookup("n2").address == "10.0.0.3"
            # Its pod is deleted (and recreated with a new uid): the entry stops counting.
            kube.put("api/v1", "pods", _pod("agent-b", "n2", "10.0.0.3", uid="new"))
            await asyncio.wait_for(_until(lambda: "n2" not in d.nodes()), 5)
        finally:
            await _stop(d)
    finally:
        await kube.stop()


async def test_pod_check_off_trusts_the_slice() -> None:
    kube = FakeKube()
    await kube.start()
    try:
        kube.put("apis/discovery.k8s.io/v1", "endpointslices", _slice(
            {"addresses": ["10.0.0.9"], "nodeName": "n1"}))
        d = AgentDirectory(kube.kube_client(), namespace=NS, service=DS, pod_check=False)
        d.start()
        try:
            await asyncio.wait_for(_until(lambda: "n1" in d.nodes()), 5)
        finally:
            await _stop(d)
    finally:
        await kube.stop()


async def test_which_nodes_the_directory_knows_and_since_when() -> None:
    """nodes/imagepulls answers 404 for a node no agent pod is bound to, 503 (retry)
    for one whose agent is not ready; a NodeImagePull's age is its agent pod's."""
    kube = FakeKube()
    await kube.start()
    try:
        ready = _pod("agent-a", "n1", "10.0.0.1")
        ready["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        kube.put("api/v1", "pods", ready)
        kube.put("api/v1", "pods", _pod("agent-b", "n2", "10.0.0.2"))  # not ready yet
        kube.put("api/v1", "pods", _pod("other", "n3", "10.0.0.3", owner="x",
                                        kind="ReplicaSet"))
        kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                 _slice(_entry("agent-a", "n1", "10.0.0.1")))
        d = await _directory(kube)
        try:
            await asyncio.wait_for(_until(lambda: "n1" in d.nodes()), 5)
            assert [d.knows(n) for n in ("n1", "n2", "n3", "n4")] == [
                True, True, False, False]
            assert d.created("n1") == "2026-01-01T00:00:00Z" and d.created("n2") == ""
        finally:
            await _stop(d)
    finally:
        await kube.stop()


def _terminating(entry: dict[str, Any], *, serving: bool) -> dict[str, Any]:
    entry["conditions"] = {"ready": False, "serving": serving, "terminating": True}
    return entry


async def test_a_surge_roll_leaves_no_node_without_an_agent() -> None:
    """The DaemonSet controller deletes the old agent once the new pod is Ready; the
    slice (or the pod cache) may show the new one ready only later. Meanwhile the old
    agent, in its preStop sleep, still serves: kube-proxy routes to it (KEP-1669), and so
    does the directory, until a ready agent is there or the old one stops serving. Fails
    without the fallback (CI at b8a55c6: a 503 "no ready aggapi agent" mid-upgrade)."""
    kube = FakeKube()
    await kube.start()
    try:
        kube.put("api/v1", "pods", _pod("agent-old", "n1", "10.0.0.1", deleting=True))
        kube.put("apis/discovery.k8s.io/v1", "endpointslices", _slice(
            _terminating(_entry("agent-old", "n1", "10.0.0.1"), serving=True),
            _entry("agent-new", "n1", "10.0.0.2")))  # its pod not in the cache yet
        d = await _directory(kube)
        try:
            await asyncio.wait_for(_until(lambda: "n1" in d.nodes()), 5)
            assert d.lookup("n1").address == "10.0.0.1"
            # The new pod reaches the cache: the ready agent wins over the terminating.
            kube.put("api/v1", "pods", _pod("agent-new", "n1", "10.0.0.2"))
            await asyncio.wait_for(_until(lambda: d.nodes()["n1"].address == "10.0.0.2"), 5)
            # A terminating agent that stopped serving (draining) is never chosen.
            kube.put("api/v1", "pods", _pod("agent-new", "n1", "10.0.0.2", uid="gone"))
            kube.put("apis/discovery.k8s.io/v1", "endpointslices", _slice(
                _terminating(_entry("agent-old", "n1", "10.0.0.1"), serving=False)))
            await asyncio.wait_for(_until(lambda: "n1" not in d.nodes()), 5)
            with pytest.raises(StatusError) as err:
                d.lookup("n1")
            assert err.value.code == 503
        finally:
            await _stop(d)
    finally:
        await kube.stop()
