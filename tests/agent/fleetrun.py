"""Several nodes on one simulated link, with the leader between them, in the real
cluster's timing (issue 37 item 3): every node runs its own progress engine
(ContainerdBackend over its own scripted containerd, reading the bytes its containerd
received), observed every ``AGENT_POLL`` s; the leader reads each node's view (as
``GET /v1/imagepulls`` serves it) once per ``LEADER_POLL`` s, judges the link
(aggapi.apiserver.collections.linkshare) once per feeder round of ``LEADER_POLL`` s at
another phase, and what it tells reaches each agent at its next poll. Every node's
pulls start within one poll, as both kubelets of 2nodes-400k-uneven start theirs.

``before``: pulls on one node alone from the same host that end ``gap`` s before the
scored ones start (the host's link as the leader has seen it). Each node's figures are
scored as tests/agent/linkrun.py scores one node's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.handlers import pull_json
from aggapi.agent.progress.model import NodeState
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.apiserver.collections.linkshare import LinkShare
from aggapi.auth.capability import ContainerRef
from tests.agent.fakectd import FakeContainerd, FakeImage, make_image
from tests.agent.linkrun import CHECKPOINTS, T0, Errors, Pull, _check
from tests.agent.linksim import SharedLink, SimLayer

AGENT_POLL = 0.25  # the agent's poller (aggapi.agent.progress.poller)
LEADER_POLL = 1.0  # --collection-poll-interval, and the link feeder's round (linkfeed.EVERY)


@dataclass
class _Node:
    name: str
    fake: FakeContainerd
    be: ContainerdBackend
    got: float = 0.0  # bytes its containerd received, every pull so far
    state: NodeState | None = None
    view: dict[str, Any] | None = None  # what the leader read last
    read_at: float = 0.0


def view_of(state: NodeState) -> dict[str, Any]:
    """The parts of a node's ``GET /v1/imagepulls`` the leader's link judgement reads."""
    pulls = state.pulls or ()
    return {"pulls": [pull_json(p) for p in pulls],
            "linkBytesPerSecond": state.link_bytes_per_second}


class Fleet:
    def __init__(self, rate: float, nodes: int, *, leader: bool = True) -> None:
        self.rate, self.leader = rate, leader
        self.now = 0.0
        self.nodes: list[_Node] = []
        for i in range(nodes):
            self.nodes.append(self._node(f"n{i + 1}", i))
        self.share = LinkShare()
        self.told: list[str] = []  # each round's told nodes, in order
        self.read: list[tuple[float, str, dict[str, Any]]] = []  # the leader's reads
        self._tick = 0

    def _node(self, name: str, i: int) -> _Node:
        fake = FakeContainerd(now=T0)

        def clock() -> float:
            return fake.now

        def received() -> int:
            return int(self.nodes[i].got)

        be = ContainerdBackend(fake, Platform("linux", "amd64"), clock=clock,
                               monotonic=clock, received=received)
        return _Node(name, fake, be)

    async def run(self, pulls: Sequence[Sequence[Pull]], tag: str, score: bool = True
                  ) -> list[Errors]:
        """Every node's ``pulls[k]`` through one link from now to the last byte; the
        nodes' figures scored at the checkpoints (one Errors per node)."""
        images: list[dict[str, FakeImage]] = [{} for _ in self.nodes]
        sim_layers: list[SimLayer] = []
        of_node: list[dict[str, int]] = [{} for _ in self.nodes]
        for k, node_pulls in enumerate(pulls):
            for i, p in enumerate(node_pulls):
                img = images[k][p.ref] = make_image(p.ref, p.sizes, f"{tag}-n{k}-{i}")
                lease = f"{tag}-n{k}-L{i}"
                self.nodes[k].fake.start_pull(img, lease)
                self.nodes[k].fake.fetch_manifest(img, lease)
                for (digest, size), w in zip(img.layers, p.weights, strict=True):
                    sim_layers.append(SimLayer(digest, size, w, lease))
                    of_node[k][digest] = size
        link = SharedLink(self.rate, sim_layers)
        finish = link.finish_times()
        start = self.now
        errs = [Errors() for _ in self.nodes]
        pending = [{(kind, key, c) for c in CHECKPOINTS
                    for kind, keys in (("layer", of_node[k]), ("image", images[k]),
                                       ("pod", ["pod"])) for key in keys}
                   for k in range(len(self.nodes))]
        pods = [[ContainerRef(f"c{i}", p.ref) for i, p in enumerate(ps)] for ps in pulls]
        committed: set[str] = set()
        ended: set[str] = set()
        before = [node.got for node in self.nodes]
        while not link.finished():
            link.run_until(link.t + AGENT_POLL)
            self.now = start + link.t
            for k, node in enumerate(self.nodes):
                node.fake.now = T0 + self.now
                node.got = before[k] + sum(link.got.get(d, 0.0) for d in of_node[k])
            for ing in link.ingests():
                k = next(k for k in range(len(self.nodes)) if ing.digest in of_node[k])
                self.nodes[k].fake.download(ing.digest, ing.offset, ing.total, ing.pull,
                                            updated_at=T0 + start + ing.updated_at,
                                            started_at=T0 + start + ing.started_at)
            for d, at in link.done.items():
                if d in committed:
                    continue
                committed.add(d)
                k = next(k for k in range(len(self.nodes)) if d in of_node[k])
                fake = self.nodes[k].fake
                fake.now = T0 + start + at
                fake.commit(d, of_node[k][d], next(la.pull for la in sim_layers
                                                   if la.digest == d))
                fake.now = T0 + self.now
            for k, node in enumerate(self.nodes):
                for i, img in enumerate(images[k].values()):
                    lease = f"{tag}-n{k}-L{i}"
                    if lease not in ended and all(d in link.done for d, _ in img.layers):
                        ended.add(lease)  # the pull ends: its lease goes
                        node.fake.finish(img, lease)
                node.state = await node.be.observe(list(images[k]))
                if score:
                    _check(node.state, link, finish, {r: [d for d, _ in im.layers]
                                                      for r, im in images[k].items()},
                           of_node[k], sum(of_node[k].values()), pods[k], pending[k],
                           errs[k], True)
            self._leader()
        return errs

    async def idle(self, seconds: float) -> None:
        """Nothing pulled for ``seconds``: agents and the leader go on polling."""
        end = self.now + seconds
        while self.now < end:
            self.now += AGENT_POLL
            for node in self.nodes:
                node.fake.now = T0 + self.now
                node.state = await node.be.observe([])
            self._leader()

    def _leader(self) -> None:
        """Called every agent poll: the leader's reads of the views, then (half a poll
        interval later) its feeder round and sends, which the agents keep from their
        next poll on."""
        self._tick += 1
        per = round(LEADER_POLL / AGENT_POLL)
        if self._tick % per == 1:
            for node in self.nodes:
                node.view = None if node.state is None else view_of(node.state)
                node.read_at = self.now
                if node.view is not None:
                    self.read.append((self.now, node.name, node.view))
        if self.leader and self._tick % per == 3:
            views: Mapping[str, dict[str, Any] | None] = {n.name: n.view for n in self.nodes}
            told = self.share.observe(T0 + self.now, views,
                                      {n.name: self.now - n.read_at for n in self.nodes})
            for node in self.nodes:
                if node.name in told:
                    node.be.tell_peers(told[node.name])
            self.told.append(",".join(sorted(told)))
