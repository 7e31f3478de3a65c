"""The Producer's stream of a pod waiting for a pull slot that another tenant's pod holds:
who may see that other pull."""

from __future__ import annotations

from typing import Any

import pytest

from aggapi.apiserver.authz import Authorizer, Permits
from aggapi.apiserver.imagepullprogress.handler import SEE_NODE_PULLS
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.requestinfo import RequestInfo
from aggapi.auth.delegated import UserInfo
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .producerrun import running
from .scripted import ScriptedAgent, event, pod_object, progress

# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


def node_busy_with(image: str, repo: str) -> dict[str, Any]:
    return {"kind": "NodeImagePulls", "inFlight": 1, "slotsFree": 0,
            "slots": {"limit": 1, "serialize": True, "source": "kubelet.yaml", "error": ""},
            "pulls": [{"lease": "l1", "images": [image], "repositories": [repo],
                       "phase": "Downloading", "progress": 1, "total": 9}]}


@pytest.mark.parametrize(("user", "sees"), [("bob", False), ("node-admin", True)])
async def test_two_tenants_waiting_for_a_slot(kube: FakeKube, user: str, sees: bool) -> None:
    """alice's pod (namespace tenant-a) holds the node's one pull slot; bob's pod
    (tenant-b) waits. bob, who may read his own pod's progress but not the node's
    pulls, sees a count; a user granted get nodes/imagepulls (SubjectAccessReview
    through the real Authorizer, against the fake kube-apiserver) sees the pull.
    At 622964a the Waiting object listed alice's image to anyone."""
    alice_img, bob_img = "reg.example/tenant-a/payroll:3", "reg.example/tenant-b/web:1"
    kube.put("api/v1", "pods", pod_object("payroll", (("app", alice_img),),
                                          namespace="tenant-a"))
    pod = pod_object("web", (("app", bob_img),), namespace="tenant-b")
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{bob_img}"',
                                       "2026-01-01T00:00:01Z"))

    def policy(spec: dict[str, Any]) -> bool:
        ra = spec.get("resourceAttributes") or {}
        if (ra.get("resource"), ra.get("subresource")) == ("nodes", "imagepulls"):
            return bool(spec["user"] == "node-admin" and ra.get("verb") == "get")
        return ra.get("namespace") == "tenant-b"

    kube.sar_policy = policy
    agent = ScriptedAgent(node_view=node_busy_with(alice_img, "reg.example/tenant-a/payroll"))
    lines = agent.stream()
    async with kube.kube_client() as api:
        info = RequestInfo(path="/x", verb="get", is_resource_request=True,
                           api_group="subresources.aggapi.io", api_version="v1alpha1",
                           resource="pods", subresource="imagepullprogress",
                           namespace="tenant-b", name="web")
        permits = Permits(Authorizer(api, Metrics()), UserInfo(user), info, "GET",
                          (SEE_NODE_PULLS,))
        async with running(kube, pod, agent, follow=True,
                           may_see_node_pulls=lambda: permits.allows(SEE_NODE_PULLS)
                           ) as (got, task):
            lines.send(progress("app", bob_img, "Waiting"))
            await until(lambda: any(o.get("phase") == "Waiting" for o in got.objs))
            task.cancel()
    waiting = next(o for o in got.objs if o.get("phase") == "Waiting")["waiting"]
    assert waiting["inFlightCount"] == 1 and waiting["limit"] == 1
    assert ("payroll" in repr(waiting)) is sees
    assert len(waiting["inFlight"]) == (1 if sees else 0)
    node_reviews = [c for c in kube.sar_calls
                    if c["spec"]["resourceAttributes"]["resource"] == "nodes"]
    assert len(node_reviews) == 1
    assert node_reviews[0]["spec"]["resourceAttributes"]["namespace"] == ""
