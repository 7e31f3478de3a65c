from __future__ import annotations

import asyncio

import pytest

from aggapi.auth.ttlcache import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_expiry_and_bound() -> None:
    clock = Clock()
    cache: TTLCache[int] = TTLCache(2, clock=clock)
    cache.put("a", 1, 10)
    cache.put("b", 2, 1)
    assert cache.get("a") == 1  # now most recently used
    cache.put("c", 3, 10)       # evicts b, the least recently used
    assert (cache.get("b"), len(cache)) == (None, 2)
    clock.now = 10.5
    assert cache.get("a") is None and cache.get("c") is None


async def test_errors_not_cached_and_loads_coalesced() -> None:
    cache: TTLCache[int] = TTLCache(10)
    calls = 0

    async def load() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls == 1:
            raise RuntimeError("down")
        return 7

    results = await asyncio.gather(*(cache.get_or_load("k", load, lambda _v: 5)
                                      for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and calls == 1
    assert await cache.get_or_load("k", load, lambda _v: 5) == (7, False)
    assert await cache.get_or_load("k", load, lambda _v: 5) == (7, True)
    assert calls == 2


async def test_cancelled_caller_does_not_cancel_shared_load() -> None:
    cache: TTLCache[int] = TTLCache(10)

    async def load() -> int:
        await asyncio.sleep(0.05)
        return 1

    first = asyncio.ensure_future(cache.get_or_load("k", load, lambda _v: 5))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(cache.get_or_load("k", load, lambda _v: 5))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == (1, True)
    with pytest.raises(asyncio.CancelledError):
        await first
