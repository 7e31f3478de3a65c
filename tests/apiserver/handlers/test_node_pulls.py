"""nodes/{node}/imagepulls: a node's in-flight pulls with the pods waiting on them."""

from __future__ import annotations

import asyncio
from typing import Any

from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import NODE
from tests.framework.throttle import ThrottleProxy

from ..conftest import GV
from .conftest import Stack, pod_object


async def test_in_flight_pull_lists_the_pods_waiting_for_it(
        stack: Stack, cri: CRIClient, throttle: ThrottleProxy, big_image: Any,
        busybox_image: str) -> None:
    ref = big_image.ref(throttle.host)
    stack.kube.put("api/v1", "pods", pod_object("w1", [("app", ref)]))
    stack.kube.put("api/v1", "pods", pod_object("w2", [("side", busybox_image), ("app", ref)],
                                                namespace="other"))
    stack.kube.put("api/v1", "pods", pod_object("unrelated", [("app", busybox_image)]))
    stack.kube.put("api/v1", "pods", pod_object("elsewhere", [("app", ref)], node="node-z"))
    throttle.set_rate(8 << 20)
    pull = asyncio.create_task(cri.pull_image(ref))
    try:
        view: dict[str, Any] = {}
        for _ in range(100):
            async with stack.session().get(f"{GV}/nodes/{NODE}/imagepulls") as resp:
                assert resp.status == 200, await resp.text()
                view = await resp.json()
            # progress is null until the agent has seen the pull's first bytes
            if view.get("pulls") and (view["pulls"][0]["progress"] or 0) > 0:
                break
            await asyncio.sleep(0.1)
        assert view["kind"] == "NodeImagePulls" and view["node"] == NODE
        assert view["inFlight"] == 1
        waiting = {(p["namespace"], p["name"], p["container"])
                   for p in view["pulls"][0]["pods"]}
        assert waiting == {("default", "w1", "app"), ("other", "w2", "app")}
    finally:
        throttle.set_rate(None)
        await pull


async def test_sar_is_get_on_nodes_imagepulls(stack: Stack) -> None:
    seen: list[dict[str, Any]] = []

    def policy(spec: dict[str, Any]) -> Any:
        seen.append(spec.get("resourceAttributes") or {})
        return False, "nope"

    stack.kube.sar_policy = policy
    async with stack.session().get(f"{GV}/nodes/{NODE}/imagepulls") as resp:
        assert resp.status == 403
    ra = seen[-1]
    assert (ra["verb"], ra["group"], ra["resource"], ra["subresource"], ra["name"]) == (
        "get", "subresources.aggapi.io", "nodes", "imagepulls", NODE)
    assert not ra.get("namespace")
