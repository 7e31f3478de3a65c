"""A list's body: whole when small, streamed a slice at a time when big; either way
the same JSON document, for plain items and for Table rows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections import listbody
from tests.framework.until import until

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                              max_size=3),
    max_leaves=6)


async def _fetch(envelope: dict[str, Any], key: str, items: list[Any],
                 render: Any = None) -> tuple[bytes, dict[str, str]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await listbody.respond(request, envelope, key, items, render)

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestServer(app) as server, aiohttp.ClientSession() as s, \
            s.get(server.make_url("/")) as resp:
        assert resp.status == 200 and resp.content_type == "application/json"
        return await resp.read(), dict(resp.headers)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(JSONISH, max_size=30), slice_=st.integers(1, 7),
       meta=st.dictionaries(st.text(max_size=5), JSONISH, max_size=3))
async def test_any_slicing_gives_the_whole_document(items: list[Any], slice_: int,
                                                    meta: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listbody, "SLICE", slice_)
    monkeypatch.setattr(listbody, "INLINE", slice_ // 2)
    envelope = {"kind": "List", "metadata": meta}
    body, _ = await _fetch(envelope, "items", items)
    assert json.loads(body) == {**envelope, "items": items}


async def test_a_big_list_is_streamed_with_rows_built_per_slice() -> None:
    items = [{"metadata": {"name": f"p{i:05d}"}, "n": i} for i in range(2 * listbody.SLICE + 3)]
    body, headers = await _fetch({"kind": "Table", "rows": "replaced"}, "rows", items,
                                 lambda o: {"cells": [o["metadata"]["name"], o["n"]]})
    # Chunked, not one Content-Length body: never encoded whole.
    assert "Content-Length" not in headers and headers.get("Transfer-Encoding") == "chunked"
    doc = json.loads(body)
    assert doc["kind"] == "Table"
    assert doc["rows"] == [{"cells": [f"p{i:05d}", i]} for i in range(len(items))]
    small, headers = await _fetch({"kind": "List"}, "items", items[:3])
    assert json.loads(small)["items"] == items[:3] and headers.get("Content-Length")


async def test_slices_are_encoded_ahead_of_a_slow_client_and_no_further(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While one slice is written (a slow client, a busy loop), the next AHEAD are
    encoded meanwhile, so the list goes on with them at the loop's next turn rather than
    one turn per slice; and no more than that are held."""
    encoded: list[int] = []
    real_encode = listbody._encode

    def counting(part: Any, render: Any, comma: bool) -> Any:
        encoded.append(len(part))
        return real_encode(part, render, comma)

    monkeypatch.setattr(listbody, "_encode", counting)
    reading = asyncio.Event()
    writes: list[int] = []
    real_write = web.StreamResponse.write

    async def slow_client(self: web.StreamResponse, data: bytes) -> None:
        writes.append(len(data))
        if len(writes) == 2:  # the first slice, after the envelope's head
            await reading.wait()
        await real_write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", slow_client)
    items = [{"n": i} for i in range(10 * listbody.SLICE)]
    fetch = asyncio.create_task(_fetch({"kind": "List"}, "items", items))
    await until(lambda: len(encoded) == 1 + listbody.AHEAD)
    await asyncio.sleep(0.2)  # (a chance to encode more, which it must not take)
    assert len(encoded) == 1 + listbody.AHEAD
    reading.set()
    body, _ = await fetch
    assert json.loads(body)["items"] == items and len(encoded) == 10
