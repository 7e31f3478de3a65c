"""The event loops the tests here run on: aggapi.serve.bodyreceiver's on both asyncio's
and uvloop's (what our processes run, aggapi.eventloop: its TLS transport is not
asyncio's, nor an asyncio.Transport subclass); the rest on asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name not in ("test_bodyreceiver.py", "test_chunktakeover.py"):
        return {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:
        return {"asyncio": asyncio.new_event_loop}
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
