"""A snapshot after a pull agrees with the stream that watched it, against real
containerd + runc and a registry (fixtures from tests/conftest.py): the layer shared
with an image pulled before stays AlreadyPresent, the pull's own layer is Done."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from aggapi import wire
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import Agent, pki, run_agent
from tests.agent.test_agent_integration import collect
from tests.framework.containerd import Containerd


@pytest.fixture
async def agent(tmp_path: Path, cri: CRIClient, ctd: ContainerdClient,
                containerd: Containerd) -> Any:
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd,
                         snapshotter=containerd.snapshotter) as a:
        yield a


async def snapshot(agent: Agent, token: str, **query: str) -> list[dict[str, Any]]:
    async with agent.get("/v1/imagepullprogress", token,
                         params={"follow": "false", **query}) as resp:
        body = await resp.text()
        assert resp.status == 200, body
        return [json.loads(x) for x in body.splitlines()]


def last_phases(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {o["layer"]: o["phase"] for o in objs if o["kind"] == "Progress" and o["layer"]}


async def test_a_snapshot_after_the_pull_says_what_the_stream_said(
        agent: Agent, cri: CRIClient, registry: Any, shared_images: Any) -> None:
    await cri.pull_image(shared_images.a.ref(registry.host))
    ref = shared_images.b.ref(registry.host)
    began = time.time()  # what kubelet's Pulled event tells the apiserver
    live = last_phases(await collect(agent, ref, cri.pull_image(ref)))
    base, own = shared_images.base.blob, shared_images.b.image.layers[1].blob
    assert live == {base.digest: "AlreadyPresent", own.digest: "Done"}

    token = agent.token(images=[ref], params={
        wire.PARAM_PULLS_BEGAN: wire.encode_pulls_began({0: began})})
    objs = await snapshot(agent, token)
    assert last_phases(objs) == live
    assert objs[-1]["kind"] == "Summary" and objs[-1]["phase"] == "Done", objs[-1]
    assert objs[-1]["progress"] == objs[-1]["total"] == own.size
    # Without the pull's start (kubelet has not said) the agent cannot tell.
    objs = await snapshot(agent, agent.token(images=[ref]))
    assert set(last_phases(objs).values()) == {"AlreadyPresent"}
