"""A snapshot after a pull tells its layers as the stream that watched it did: the
apiserver vouches for when the pull began (kubelet's Pulled, in the token's
``pullsBegan``) and the agent counts a present layer committed since as Done.
Real TLS on 127.0.0.1; containerd is the in-memory fake."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggapi import wire
from aggapi.agent.progress.layers import with_pulls_began
from aggapi.agent.progress.model import ImageState, LayerState, NodeState
from tests.agent.agentserver import Agent, pki, run_agent
from tests.agent.fakectd import FakeContainerd, FakeImage, make_image, sha
from tests.agent.test_agent_api import FakeCRI, sandbox

A = "127.0.0.1:5000/a:1"
B = "127.0.0.1:5000/b:1"
BASE = (sha(b"base"), 4000, sha(b"base-diff"))


@pytest.fixture
def fake() -> FakeContainerd:
    fake = FakeContainerd()
    fake.now = time.time() - 3600
    return fake


@pytest.fixture
async def agent(tmp_path: Path, fake: FakeContainerd) -> AsyncIterator[Agent]:
    async with run_agent(pki(tmp_path / "pki"), cri=FakeCRI([sandbox("default", "p", "uid-1")]),
                         containerd=fake, poll_interval=0.02) as a:
        yield a


def pulled(fake: FakeContainerd, img: FakeImage, lease: str) -> None:
    """``img`` pulled now: its manifest, then each layer's snapshot that is not there."""
    fake.start_pull(img, lease)
    fake.fetch_manifest(img, lease)
    for (digest, size), chain in zip(img.layers, img.chains, strict=True):
        if chain not in fake.snapshots:
            fake.put_blob(None, digest, size, {}, lease)
            fake.extract(chain, active=False)
    fake.finish(img, lease)


def shared_then_own(fake: FakeContainerd) -> tuple[FakeImage, float]:
    """A pulled first; B, sharing A's base layer, 100 s later: B and its pull's start."""
    pulled(fake, make_image(A, [100], "a", shared=[BASE]), "LA")
    fake.now += 100
    began = fake.now
    b = make_image(B, [200, 300], "b", shared=[BASE])
    fake.now += 0.5
    pulled(fake, b, "LB")
    fake.now += 60
    return b, began


async def get(agent: Agent, token: str, **query: str) -> tuple[int, list[dict[str, Any]]]:
    async with agent.get("/v1/imagepullprogress", token, params=query) as resp:
        body = await resp.text()
        if resp.status != 200:
            return resp.status, [json.loads(body)]
        return resp.status, [json.loads(x) for x in body.splitlines()]


def began_token(agent: Agent, began: dict[int, float], images: tuple[str, ...] = (B,)) -> str:
    """A token for containers c0, c1... of ``images``; ``began`` by container index."""
    return agent.token(images=list(images), params={
        "granularity": "layer", wire.PARAM_PULLS_BEGAN: wire.encode_pulls_began(began)})


@pytest.mark.parametrize("follow", ["false", "true"])
async def test_after_the_pull_its_own_layers_are_done_the_shared_one_present(
        agent: Agent, fake: FakeContainerd, follow: str) -> None:
    """At 44c707c every layer read AlreadyPresent: the agent had no pull start."""
    b, began = shared_then_own(fake)
    code, objs = await get(agent, began_token(agent, {0: began}), follow=follow)
    assert code == 200, objs
    layers = {o["layer"]: o["phase"] for o in objs if o["kind"] == "Progress"}
    assert layers == {BASE[0]: "AlreadyPresent", b.layers[1][0]: "Done",
                      b.layers[2][0]: "Done"}
    # The image's bytes are those its pull brought, as the live stream said.
    summary = objs[-1]
    assert summary["kind"] == "Summary" and summary["phase"] == "Done", summary
    assert summary["progress"] == summary["total"] == 500
    code, objs = await get(agent, began_token(agent, {0: began}), follow="false",
                           granularity="image")
    assert [(o["phase"], o["total"]) for o in objs if o["kind"] == "Progress"] == [
        ("Done", 500)]


async def test_without_a_start_every_present_layer_stays_already_present(
        agent: Agent, fake: FakeContainerd) -> None:
    """No start vouched for (kubelet found the image, or has not said): as before."""
    shared_then_own(fake)
    code, objs = await get(agent, agent.token(images=[B]), follow="false")
    assert code == 200, objs
    assert {o["phase"] for o in objs if o["kind"] == "Progress"} == {"AlreadyPresent"}
    assert objs[-1]["phase"] == "AlreadyPresent"


async def test_a_start_after_the_commits_leaves_them_present(
        agent: Agent, fake: FakeContainerd) -> None:
    _, began = shared_then_own(fake)
    code, objs = await get(agent, began_token(agent, {0: began + 1}), follow="false")
    assert code == 200, objs
    assert {o["phase"] for o in objs if o["kind"] == "Progress"} == {"AlreadyPresent"}


async def test_the_start_is_read_from_the_token_only(agent: Agent, fake: FakeContainerd
                                                    ) -> None:
    """The query cannot say it: only what the apiserver signed counts."""
    _, began = shared_then_own(fake)
    raw = wire.encode_pulls_began({0: began})
    code, objs = await get(agent, agent.token(images=[B]), follow="false",
                           **{wire.PARAM_PULLS_BEGAN: raw})
    assert code == 200, objs
    assert {o["phase"] for o in objs if o["kind"] == "Progress"} == {"AlreadyPresent"}


@pytest.mark.parametrize(("raw", "needle"), [
    ("not json", "not JSON"),
    ("[1]", "must be an object"),
    ('{"1": 1}', "not a container of the capability"),
    ('{"-0": 1}', "not a container of the capability"),
    ('{"0x0": 1}', "not a container of the capability"),
    ('{"\u0660": 1}', "not a container of the capability"),  # an Arabic-Indic zero
    ('{"127.0.0.1:5000/b:1": 1}', "not a container of the capability"),
    ('{"0": true}', "epoch milliseconds"),
    ('{"0": 1.5}', "epoch milliseconds"),
    ('{"0": -1}', "epoch milliseconds"),
    ('{"0": 0}', "epoch milliseconds"),
    ('{"0": 99999999999999999999}', "epoch milliseconds"),
])
async def test_a_bad_start_is_400(agent: Agent, fake: FakeContainerd, raw: str,
                                  needle: str) -> None:
    token = agent.token(images=[B], params={wire.PARAM_PULLS_BEGAN: raw})
    code, objs = await get(agent, token, follow="false")
    assert code == 400, objs
    assert objs[0]["kind"] == "Status" and needle in objs[0]["message"], objs


async def test_a_start_a_day_ahead_of_the_node_is_400(agent: Agent) -> None:
    raw = json.dumps({"0": int((time.time() + 2 * 86400) * 1000)})
    token = agent.token(images=[B], params={wire.PARAM_PULLS_BEGAN: raw})
    code, objs = await get(agent, token, follow="false")
    assert code == 400 and "a day from now" in objs[0]["message"], objs


@given(st.one_of(st.text(max_size=200), st.builds(json.dumps, st.dictionaries(
    st.one_of(st.sampled_from(["0", "1", "2", "00", "-1"]), st.text(max_size=6)),
    st.one_of(st.integers(), st.floats(), st.booleans(), st.none(), st.text(max_size=5))))))
def test_decoding_takes_only_the_tokens_containers_at_sane_times(raw: str) -> None:
    now = 2_000_000_000.0
    try:
        got = wire.decode_pulls_began(raw, 2, now)
    except ValueError:
        return
    assert set(got) <= {0, 1}
    assert all(0 < t <= now + 86400 for t in got.values())


def test_a_start_too_long_to_read_is_refused() -> None:
    with pytest.raises(ValueError, match="over"):
        wire.decode_pulls_began('{"0": "' + "y" * 20000 + '"}', 1, time.time())


@pytest.mark.parametrize("phase", ["Done", "Downloading", "Resolving", "Extracting"])
def test_a_pull_the_agent_watched_keeps_its_own_phases(phase: str) -> None:
    """A layer there before a re-pull the agent watches (imagePullPolicy Always) stays
    AlreadyPresent, whatever an earlier pull's start says: the start is only for an
    image the agent found already there."""
    layers = (LayerState("sha256:l0", "AlreadyPresent", 5, 5, present_since=110.0),
              LayerState("sha256:l1", "Done", 7, 7, present_since=120.0))
    state = NodeState("containerd", {B: ImageState(B, phase, layers, 7, 7)})
    assert with_pulls_began(state, {B: 100.0}) is state
    found = NodeState("containerd", {B: ImageState(B, "AlreadyPresent", layers[:1], 0, 0)})
    st = with_pulls_began(found, {B: 100.0}).images[B]
    assert (st.phase, [la.phase for la in st.layers], st.progress, st.total) == (
        "Done", ["Done"], 5, 5)


async def test_two_containers_of_one_image_take_the_earlier_start(
        agent: Agent, fake: FakeContainerd) -> None:
    b, began = shared_then_own(fake)
    code, objs = await get(agent, began_token(agent, {0: began + 1, 1: began}, (B, B)),
                           follow="false")
    assert code == 200, objs
    assert {(o["container"], o["layer"]): o["phase"] for o in objs
            if o["kind"] == "Progress"} == {
        (c, la): "AlreadyPresent" if la == BASE[0] else "Done"
        for c in ("c0", "c1") for la, _ in b.layers}
