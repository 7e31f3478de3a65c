"""The leader's link peers sent to the agents (issue 37 item 3): after each round of
node views, the nodes judged to share one link each get a signed PUT of their peers."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.linkfeed import LinkFeeder
from aggapi.linkpeers import PeerLink, PeerPull, parse
from aggapi.status import StatusError
from aggapi.wire import AGENT_LINK_PEERS_PATH, OP_LINK_PEERS

from .fakes import FakeAgent, node_view, pull

REPO = "registry.test/app"


class _Polls:
    """Each view read at the feeder's clock ``now`` (its age is 0)."""

    def __init__(self, now: list[float]) -> None:
        self.views: dict[str, Any] = {}
        self.now = now

    def parts(self) -> dict[str, Any]:
        return {n: SimpleNamespace(view=v, read_at=self.now[0]) for n, v in self.views.items()}


def _feeder(agent: Any, every: float = 1.0) -> tuple[LinkFeeder, _Polls, list[float]]:
    now = [0.0]
    polls = _Polls(now)
    feeder = LinkFeeder(cast(AgentClient, agent), cast(Any, polls), every=every,
                        clock=lambda: now[0])
    return feeder, polls, now


def _views(rates: dict[str, float]) -> dict[str, Any]:
    return {n: node_view(pull(REPO, progress=0, total=3_000_000, rate=r))
            for n, r in rates.items()}


async def _play(feeder: LinkFeeder, polls: _Polls, now: list[float]) -> None:
    """a pulls alone, then b joins at 5 s on the one link: a gives b its share."""
    for i in range(24):
        now[0] = i * 0.5
        polls.views = _views({"a": 4e5} if now[0] < 5.0 else {"a": 2.4e5, "b": 1.6e5})
        await feeder.round()


async def test_nodes_on_one_link_are_each_told_their_peers() -> None:
    agent = FakeAgent()
    feeder, polls, now = _feeder(agent)
    await _play(feeder, polls, now)
    assert agent.puts, "nothing told"
    assert {p[1:3] for p in agent.puts} == {(AGENT_LINK_PEERS_PATH, OP_LINK_PEERS)}
    last = {node: parse(json.loads(body)) for node, _, _, body in agent.puts}
    assert last["a"] == PeerLink({"b": (PeerPull(3e6, 1.6e5),)}, 4e5)
    assert last["b"] == PeerLink({"a": (PeerPull(3e6, 2.4e5),)}, 4e5)
    assert not agent.reads  # the feeder reads no views itself: the polls do


async def test_an_agent_that_refuses_is_skipped() -> None:
    """An older agent answers 404: the round goes on for the others."""
    class Refusing(FakeAgent):
        async def open(self, method: str, path: str, *, node: str, **kw: Any) -> Any:
            if node == "a":
                raise StatusError(404, "no such agent endpoint")
            return await super().open(method, path, node=node, **kw)

    agent = Refusing()
    feeder, polls, now = _feeder(agent)
    await _play(feeder, polls, now)
    assert {p[0] for p in agent.puts} == {"b"}


async def test_an_agent_that_never_answers_does_not_hold_the_others_words() -> None:
    """Node a's agent takes the PUT and never answers (a node under load, a half-open
    connection; the client has no total timeout). Before stop 42 the round awaited every
    send: it never ended, and b's word, kept 3 s, was gone for good. Now b is told every
    round and a has one send out at a time."""
    class Stuck(FakeAgent):
        async def open(self, method: str, path: str, *, node: str, **kw: Any) -> Any:
            resp = await super().open(method, path, node=node, **kw)
            if node == "a":
                await asyncio.Event().wait()
            return resp

    agent = Stuck()
    feeder, polls, now = _feeder(agent, every=0.01)
    async with asyncio.timeout(10):  # a bound for the old code's hang, not a speed goal
        await _play(feeder, polls, now)
    await feeder.stop()
    plain = FakeAgent()
    await _play(*_feeder(plain, every=0.01))
    told = [node for node, _, _, _ in agent.puts]
    assert told.count("a") == 1, told
    assert told.count("b") == [n for n, _, _, _ in plain.puts].count("b") > 1, told
