"""Polling a condition in async tests: the one helper every suite here waits with."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def until(pred: Callable[[], Any], within: float = 5.0, every: float = 0.02) -> None:
    """Poll ``pred`` (sync or async) until truthy; AssertionError after ``within`` s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)
