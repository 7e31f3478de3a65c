"""HTTP handlers of the progress engine: the pod view (NDJSON) and the node view.

GET /v1/imagepullprogress?granularity=layer|image|pod&follow=true|false[&container=C]
GET /v1/imagepulls

When the pod's own pulls began (``pullsBegan``, aggapi.wire) is read from the
capability alone: the apiserver vouches for it from kubelet's events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from aggapi import wire
from aggapi.agent.auth import CAPABILITY
from aggapi.agent.kubeletconfig import KubeletConfigReader
from aggapi.agent.progress import view
from aggapi.agent.progress.layers import with_pulls_began
from aggapi.agent.progress.linkticks import LinkTicks
from aggapi.agent.progress.model import NodeState, PullState
from aggapi.agent.progress.poller import ProgressPoller
from aggapi.auth.capability import Capability, ContainerRef
from aggapi.status import StatusError

NDJSON = "application/x-ndjson"
KEEPALIVE = 10.0  # seconds without change before the current state is sent again


def _flag(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise StatusError(400, f"{name} must be true or false")


def _containers(request: web.Request, cap: Capability) -> list[ContainerRef]:
    name = request.query.get(wire.PARAM_CONTAINER, "")
    if name and cap.container(name) is None:
        raise StatusError(403, f"container {name!r} is not in the capability")
    out = [c for c in cap.containers if c.image and (not name or c.name == name)]
    if not out:
        raise StatusError(400, "the capability names no container with an image")
    return out


def _pulls_began(cap: Capability) -> dict[str, float]:
    """When each image's pull began, by image (the earliest of its containers')."""
    raw = cap.params.get(wire.PARAM_PULLS_BEGAN)
    if raw is None:
        return {}
    try:
        by_index = wire.decode_pulls_began(raw, len(cap.containers), time.time())
    except ValueError as err:
        raise StatusError(400, str(err)) from None
    out: dict[str, float] = {}
    for i, t in by_index.items():
        image = cap.containers[i].image
        out[image] = min(out.get(image, t), t)
    return out


def _seen(state: NodeState, began: Mapping[str, float]) -> NodeState:
    return with_pulls_began(state, began) if began else state


def _lines(objs: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objs)


def _closing(containers: Sequence[ContainerRef], state: NodeState) -> dict[str, Any] | None:
    err = view.failure(containers, state)
    if err is not None:
        return err
    if view.finished(containers, state):
        return view.summary(containers, state)
    return None


def pull_json(p: PullState) -> dict[str, Any]:
    return {"lease": p.lease, "startedAt": view.rfc3339(p.started_at), "phase": p.phase,
            "repositories": list(p.repositories), "images": list(p.images),
            "digest": p.root_digest, "progress": p.progress, "total": p.total,
            "bytesPerSecond": p.bytes_per_second, "etaSeconds": p.eta_seconds,
            "downloadingLayers": p.downloading_layers}


class ProgressHandlers:
    """The progress routes, bound at construction to the node's one poller, kubelet's
    pull limits and the node's name."""

    def __init__(self, poller: ProgressPoller, pull_limits: KubeletConfigReader,
                 node_name: str, ticks: LinkTicks | None = None) -> None:
        self.poller = poller
        self.pull_limits = pull_limits
        self.node_name = node_name
        self.ticks = ticks

    async def imagepullprogress(self, request: web.Request) -> web.StreamResponse:
        cap: Capability = request[CAPABILITY]
        granularity = request.query.get("granularity", "layer")
        if granularity not in view.GRANULARITIES:
            raise StatusError(400, f"granularity must be one of {', '.join(view.GRANULARITIES)}")
        follow = _flag(request, "follow", True)
        containers = _containers(request, cap)
        began = _pulls_began(cap)
        images = {c.image for c in containers}
        poller = self.poller

        if not follow:
            state = _seen(await poller.observe_once(images), began)
            objs = view.objects(containers, state, granularity)
            end = _closing(containers, state)
            return web.Response(body=_lines(objs + ([end] if end else [])), content_type=NDJSON)

        resp = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        sent: dict[tuple[str, str, str], dict[str, Any]] = {}
        last: NodeState | None = None
        async with poller.subscribe(images) as sub:
            while True:
                got = await sub.next(max_wait=KEEPALIVE)
                if got is None:
                    if last is None:
                        continue
                    # Nothing changed for a while: say so (keeps proxies from idling out).
                    got, sent = NodeState(last.backend, last.images, last.pulls, last.error,
                                          time.time()), {}
                last = got
                state = _seen(got, began)
                objs = view.objects(containers, state, granularity)
                fresh = [o for o in objs if sent.get(view.key(o)) != view.without_time(o)]
                for o in fresh:
                    sent[view.key(o)] = view.without_time(o)
                end = _closing(containers, state)
                if fresh or end:
                    await resp.write(_lines(fresh + ([end] if end else [])))
                if end is not None:
                    break
        await resp.write_eof()
        return resp

    async def imagepulls(self, request: web.Request) -> web.Response:
        """Every in-flight pull on the node and kubelet's pull limits: together they tell
        'waiting for a pull slot' (in flight >= slots) from 'stuck' (a slot, no activity).
        Only containerd leases that are pulls count (backend)."""
        state = await self.poller.observe_once(())
        limits = await self.pull_limits.limits()
        present = None if state.error else await self.poller.backend.present_images()
        pulls = state.pulls
        in_flight = None if pulls is None else len(pulls)
        slots = limits.parallel_slots
        body = {
            "kind": "NodeImagePulls",
            "node": self.node_name,
            "backend": state.backend,
            "kubelet": limits.to_json(),
            # limit null: unlimited, or (with an error) not known.
            "slots": limits.slots_json(),
            "inFlight": in_flight,
            "pulls": None if pulls is None else [pull_json(p) for p in pulls],
            "slotsFree": None if slots is None or in_flight is None else max(slots - in_flight, 0),
            "linkBytesPerSecond": state.link_bytes_per_second,
            # containerd's received bytes at wall-clock ticks while layers download
            # (aggapi/agent/progress/linkticks.py): the leader's link judgement.
            "linkTicks": self._ticks(),
            # The images on the node: the apiserver's collections tell "already
            # present" from "kubelet has not asked yet" by it before kubelet's event.
            "presentImages": None if present is None else list(present),
            "error": state.error,
            "time": view.rfc3339(state.time),
        }
        return web.json_response(body)

    def _ticks(self) -> list[list[float]] | None:
        if self.ticks is None:
            return None
        self.ticks.want()
        return self.ticks.view()
