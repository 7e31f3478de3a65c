"""A list's body: a small one whole, a big one streamed. The envelope goes first, then
the items a slice at a time, each slice encoded (and, for a Table, its rows built) off
the event loop, a few ahead of the one written. Encoded whole, a 50,000-object list
held its text about three times at once (the encoder's pieces, the str, the bytes):
some 300 MB per list in flight, for every client that relists after a leader change;
in slices of 2,000 (~1.4 MB) it holds at most five."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

INLINE = 200  # items encoded on the event loop; more go to a thread
# Items per thread hop and per write; a list of more is streamed. Each hop waits for a
# thread and a turn of the loop: in the replay's rollout, 100 hops of 500 made a
# 50,000-object list wait 2.4 s on the leader, 25 of 2,000 1.1 s (each encode holds the
# loop ~15 ms).
SLICE = 2000
# Slices encoded ahead of the one being written. Each slice's encoding ends on a thread
# and the list goes on at the loop's next turn: one turn per slice, and in a rollout
# each turn took ~60 ms (a 50,000-object list spent 6.3 of its 7 s waiting for them).
# With slices ready ahead, one turn writes them all; at most AHEAD + 1 slices are held.
AHEAD = 4
SLOW = 1.0  # seconds: a streamed list slower than this is logged (kube's list trace)

Render = Callable[[Any], Any]


def _items(part: Sequence[Any], render: Render | None) -> list[Any]:
    return [render(o) for o in part] if render is not None else list(part)


def _encode(part: Sequence[Any], render: Render | None, comma: bool) -> tuple[bytes, float]:
    began = time.thread_time()
    text = json.dumps(_items(part, render))[1:-1]  # the items, without the brackets
    return ((", " if comma and text else "") + text).encode(), time.thread_time() - began


async def respond(request: web.Request, envelope: Mapping[str, Any], key: str,
                  items: Sequence[Any], render: Render | None = None,
                  began: float | None = None) -> web.StreamResponse:
    """``envelope`` with ``items`` (each through ``render``) under ``key``; ``began``:
    when the handler took the request (monotonic), for the slow list's log."""
    if len(items) <= SLICE:
        body = {**envelope, key: _items(items, render)}
        text = await asyncio.to_thread(json.dumps, body) if len(items) > INLINE \
            else json.dumps(body)
        return web.Response(text=text, content_type="application/json")
    streaming = time.monotonic()
    began = streaming if began is None else began
    head = json.dumps({**{k: v for k, v in envelope.items() if k != key}, key: []})
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(head[:-2].encode())  # through the items' opening bracket
    loop = asyncio.get_running_loop()
    starts = iter(range(0, len(items), SLICE))
    ahead: deque[asyncio.Future[tuple[bytes, float]]] = deque()

    def encode_next() -> None:
        i = next(starts, None)
        if i is not None:
            ahead.append(loop.run_in_executor(
                None, functools.partial(_encode, items[i:i + SLICE], render, i > 0)))

    encoding = waiting = 0.0
    sent = 0
    try:
        for _ in range(AHEAD):
            encode_next()
        while ahead:
            hop = time.monotonic()
            part, took = await ahead.popleft()  # (done already: no turn of the loop)
            waiting += time.monotonic() - hop
            encoding += took
            encode_next()
            sent += len(part)
            await resp.write(part)
    finally:  # the client left: the slices not yet encoded never are
        for fut in ahead:
            fut.cancel()
    await resp.write(b"]}")
    await resp.write_eof()
    if (spent := time.monotonic() - began) > SLOW:
        log.info("slow list", extra={
            "path": request.path, "objects": len(items), "bytes": sent,
            "seconds": round(spent, 3), "headSeconds": round(streaming - began, 3),
            "encodeSeconds": round(encoding, 3),
            "waitSeconds": round(waiting, 3)})
    return resp
