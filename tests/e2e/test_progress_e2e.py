"""pods/imagepullprogress through the real aggregator and real kubectl.

kubectl get --raw -> kube-apiserver (authn, RBAC, aggregator, front-proxy TLS) -> aggapi
apiserver (netns api) -> agent (netns node) -> containerd, while the kubelet stand-in pulls
through CRI and posts kubelet's events (tests.framework.standin).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.framework.controlplane import ControlPlane
from tests.framework.node import Node
from tests.framework.pods import ContainerSpec
from tests.framework.procs import Proc
from tests.framework.standin import StandinKubelet, StandinPod, SyncStandin

from .conftest import (
    GROUP_VERSION,
    E2EPod,
    api_get,
    begin_pull,
    finish_pulling_pod,
    kubectl,
    kubectl_stream,
    start_pulling_pod,
)


def progress(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == "Progress"]


async def test_present_image_ends_with_summary(control_plane: ControlPlane,
                                               workload_pod: E2EPod) -> None:
    r = await kubectl_stream(control_plane, workload_pod.path("imagepullprogress"), timeout=30)
    assert r.rc == 0, r.err
    assert r.seconds < 15
    last = r.objects[-1]
    assert last["kind"] == "Summary" and last["phase"] in ("Done", "AlreadyPresent"), last
    assert [i["container"] for i in last["images"]] == ["app"]
    assert {o["phase"] for o in progress(r.objects)} <= {"Done", "AlreadyPresent"}
    # Granularity through the aggregator's unchanged query string.
    r = await kubectl_stream(control_plane, workload_pod.path(
        "imagepullprogress", granularity="pod"), timeout=30)
    prog = progress(r.objects)
    assert len(prog) == 1 and prog[0]["container"] == "" and prog[0]["image"] == ""


async def test_failed_pull_ends_with_the_registry_error(
        control_plane: ControlPlane, node: Node, node_agent: Proc,
        standin: SyncStandin) -> None:
    """The stand-in's pull fails in containerd and it posts kubelet's events (Pulling,
    Failed, "Error: ErrImagePull", BackOff, "Error: ImagePullBackOff") and statuses:
    the stream ends with an Error object carrying the registry's text."""
    image = node.via_registry("aggapi-test/missing:nope")

    async def run(k: StandinKubelet) -> StandinPod:
        return await k.run("bad-image", [ContainerSpec("app", image)])

    pod = await asyncio.to_thread(standin.call, run)
    try:
        text = pod.pull_errors["app"]
        assert "not found" in text, text
        # A snapshot: following would stay open for kubelet's retries.
        r = await kubectl_stream(control_plane, E2EPod("default", "bad-image", "app", image,
                                                       pod).path("imagepullprogress",
                                                                 {"follow": "false"}),
                                 timeout=30)
    finally:
        async def delete(k: StandinKubelet) -> None:
            await k.delete(pod)

        await asyncio.to_thread(standin.call, delete)
    assert r.rc == 0, r.err
    last = r.objects[-1]
    assert last["kind"] == "Error", last
    assert last["phase"] == "BackOff", last
    assert text in last["error"], (text, last)


async def test_errors(control_plane: ControlPlane, workload_pod: E2EPod) -> None:
    """404 pod, 400 bad parameters: kube-apiserver relays aggapi's Status, kubectl says so."""
    ghost = f"{GROUP_VERSION}/namespaces/default/pods/ghost/imagepullprogress"
    r = await kubectl(control_plane, "get", "--raw", ghost)
    assert r.rc == 1 and "Error from server (NotFound)" in r.err, r.err
    assert 'pods "ghost" not found' in r.err
    for query, needle in (({"container": "nope"}, "nope"),
                          ({"granularity": "bogus"}, "granularity"),
                          ({"follow": "maybe"}, "follow")):
        r = await kubectl(control_plane, "get", "--raw",
                          workload_pod.path("imagepullprogress", query))
        assert r.rc == 1 and "Error from server (BadRequest)" in r.err, (query, r.err)
        assert needle in r.err, (query, r.err)


async def test_no_agent_on_the_node_is_503(control_plane: ControlPlane, node: Node,
                                          node_agent: Proc, standin: SyncStandin) -> None:
    """A pod bound to a node with no agent: 503 with Retry-After, for both subresources.

    Asked as alice over HTTPS, not with kubectl: client-go retries a 503 that carries
    Retry-After up to 10 times, so kubectl would print the same Status only after ~10 x
    Retry-After (50 s), and could not show the header it waited on."""
    async def create(k: StandinKubelet) -> StandinPod:
        return await k.create("agentless", [ContainerSpec("app", node.images.busybox)],
                              node_name="node-without-agent")

    # The node exists (with no agent): kube-controller-manager's pod garbage collector
    # deletes pods bound to a node that does not.
    control_plane.apply([{"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": "node-without-agent"}}])
    pod = await asyncio.to_thread(standin.call, create)
    p = E2EPod("default", "agentless", "app", node.images.busybox, pod)
    try:
        replies = await asyncio.gather(
            api_get(control_plane, p.path("imagepullprogress")),
            api_get(control_plane, p.path("copy", container="app", path="/etc/passwd")))
    finally:
        async def delete(k: StandinKubelet) -> None:
            await k.delete(pod)

        await asyncio.to_thread(standin.call, delete)
        control_plane.kubectl("delete", "node", "node-without-agent", "--ignore-not-found")
    for r in replies:
        assert r.status == 503, (r.status, r.body[:300])
        status = json.loads(r.body)
        assert status["kind"] == "Status" and status["code"] == 503, status
        retry = r.headers.get("Retry-After", "")
        assert retry.isdigit() and int(retry) > 0, dict(r.headers)
        assert status["details"]["retryAfterSeconds"] == int(retry), status
        assert status["reason"] == "ServiceUnavailable", status
        assert 'no ready aggapi agent on node "node-without-agent"' in status["message"], \
            status


async def test_image_removed_then_pulled_again_is_followed_live(
        control_plane: ControlPlane, node: Node, node_agent: Proc,
        standin: SyncStandin) -> None:
    """Same image name, second pod, after the first pod and the image were removed (what
    kubelet's image GC does): the second stream must follow the new download."""
    total = sum(size for _, size in node.images.big_layers)
    for name in ("again-1", "again-2"):
        pod = start_pulling_pod(standin, node, name, rate=total / 8, start=False)
        try:
            watch = asyncio.create_task(kubectl_stream(
                control_plane, pod.path("imagepullprogress", watch=True), timeout=120))
            await asyncio.sleep(1.0)
            begin_pull(standin, pod)
            w = await watch
            await asyncio.to_thread(pod.pull.result, 60)
        finally:
            await asyncio.to_thread(finish_pulling_pod, standin, node, pod)
        assert w.rc == 0 and w.objects[-1]["kind"] == "Summary", w.err
        assert any(o.get("phase") == "Downloading" for o in w.objects), (name, w.objects[:3])
