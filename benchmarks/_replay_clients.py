"""The replay's clients: watchers of every podimagepull that list and watch through a
replica picked at random for each request, as client-go's reflector (resume from the
last version when a watch ends, list again on 410), and the counting that says
whether each got every change exactly once (:class:`Tally`, unit-tested alone).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

PATH = "/apis/subresources.aggapi.io/v1alpha1/podimagepulls"


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


@dataclass
class Tally:
    """One watcher's cache ((resourceVersion, phase) by pod) and what went wrong: an
    event at or below a version already delivered is a duplicate; an object the fresh
    list has at another version (or not at all), or a change to one never added, is a
    lost event."""

    cache: dict[str, tuple[int, str]] = field(default_factory=dict)
    rv: int = 0
    duplicates: int = 0
    unknown: int = 0  # MODIFIED/DELETED of a pod never added: its ADDED was lost
    events: int = 0
    lists: int = 0
    listed_at: float = 0.0
    done_at: dict[str, float] = field(default_factory=dict)  # first seen Done
    gap_max: float = 0.0  # longest time without a change, once changes flowed
    last_change: float = 0.0

    def _changed(self, now: float) -> None:
        if self.last_change:
            self.gap_max = max(self.gap_max, now - self.last_change)
        self.last_change = now

    def listed(self, items: Iterable[Mapping[str, Any]], rv: str, now: float) -> None:
        self.cache = {_key(o): (int(o["metadata"]["resourceVersion"]), _phase(o))
                      for o in items}
        self.rv, self.lists, self.listed_at = int(rv), self.lists + 1, now
        # Only the first list's Dones came before this watcher (no latency); a re-list
        # (after a 410) delivers the Dones it missed meanwhile, late, at `now`.
        seen = -1.0 if self.lists == 1 else now
        for k, (_, phase) in self.cache.items():
            if phase == "Done":
                self.done_at.setdefault(k, seen)
        if self.lists > 1:
            self._changed(now)

    def event(self, kind: str, obj: Mapping[str, Any], now: float) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        if kind == "BOOKMARK":
            self.rv = max(self.rv, rv)
            return
        self.events += 1
        self._changed(now)
        if rv <= self.rv:
            self.duplicates += 1
        key = _key(obj)
        if kind in ("MODIFIED", "DELETED") and key not in self.cache:
            self.unknown += 1
        if kind == "DELETED":
            self.cache.pop(key, None)
        else:
            self.cache[key] = (rv, _phase(obj))
            if _phase(obj) == "Done":
                self.done_at.setdefault(key, now)
        self.rv = max(self.rv, rv)

    def absent(self, fresh: Mapping[str, int]) -> int:
        """Changes this cache missed, against a fresh list (key -> resourceVersion)."""
        missed = sum(1 for k, rv in fresh.items() if self.cache.get(k, (None,))[0] != rv)
        return missed + sum(1 for k in self.cache if k not in fresh)

    def lost(self, fresh: Mapping[str, int]) -> int:
        return self.absent(fresh) + self.unknown


def fresh_versions(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return {_key(o): int(o["metadata"]["resourceVersion"]) for o in items}


class Replicas:
    """Requests as one user through the front proxies, each to one picked at random."""

    def __init__(self, proxies: Sequence[str], token: str, seed: int) -> None:
        self.proxies = list(proxies)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.rng = random.Random(seed)
        self.ready = [True] * len(self.proxies)
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
            connector=aiohttp.TCPConnector(limit=0))

    def pick(self) -> str:
        """A replica at random among the ready ones (``ready``, kept by the bench as
        endpoints are), or among all if none is."""
        up = [p for p, ok in zip(self.proxies, self.ready, strict=False) if ok]
        return self.rng.choice(up or self.proxies)

    async def list(self) -> tuple[int, dict[str, Any] | str]:
        """(status, the list) from a random replica; parsed off the event loop."""
        async with self.session.get(self.pick() + PATH, headers=self.headers) as resp:
            body = await resp.read()
        if resp.status != 200:
            return resp.status, body[:300].decode(errors="replace")
        return 200, await asyncio.to_thread(json.loads, body)

    async def close(self) -> None:
        await self.session.close()


INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Watcher:
    """client-go's reflector in short, every podimagepull, counted by a Tally. With
    ``streaming``, its list is a watch's initial events (client-go's WatchList:
    ``sendInitialEvents=true``) ending with the initial-events-end bookmark."""

    def __init__(self, replicas: Replicas, seed: int, *, streaming: bool = False) -> None:
        self.replicas = replicas
        self.rng = random.Random(seed)
        self.streaming = streaming
        self.tally = Tally()
        self.errors: dict[str, int] = {}
        self.gone = 0  # 410s: lists again
        # (monotonic, what): each list and watch with its replica and how it ended,
        # written beside the replicas' logs (where a hand-over's gap went)
        self.timeline: list[tuple[float, str]] = []

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1
        self._note(what)

    def _note(self, what: str) -> None:
        self.timeline.append((round(time.monotonic(), 3), what))

    async def _list(self) -> bool:
        self._note("list")
        code, body = await self.replicas.list()
        if code != 200 or not isinstance(body, dict):
            self._error(f"list {code}")
            return False
        self.tally.listed(body.get("items") or (), body["metadata"]["resourceVersion"],
                          time.monotonic())
        return True

    async def _watch(self) -> None:
        initial: list[Mapping[str, Any]] | None = None
        since = f"&resourceVersion={self.tally.rv}"
        if not self.tally.rv:  # streaming: the state first, as ADDED events
            initial = []
            since = "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        replica = self.replicas.pick()
        url = (f"{replica}{PATH}?watch=true&allowWatchBookmarks=true"
               f"{since}&timeoutSeconds={self.rng.randint(30, 90)}")
        events = self.tally.events
        self._note(f"watch {replica} from {self.tally.rv}")
        try:
            await self._stream(url, initial)
        finally:
            self._note(f"watch ended: {self.tally.events - events} events")

    async def _stream(self, url: str, initial: list[Mapping[str, Any]] | None) -> None:
        async with self.replicas.session.get(url, headers=self.replicas.headers) as resp:
            if resp.status == 410:
                self.gone += 1
                self.tally.rv = 0
                return
            if resp.status != 200:
                self._error(f"watch {resp.status}")
                await asyncio.sleep(0.5)
                return
            async for line in resp.content:
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "ERROR":
                    code = (ev.get("object") or {}).get("code")
                    self._error(f"watch ERROR {code}")
                    if code == 410:
                        self.gone += 1
                        self.tally.rv = 0
                    return
                kind, obj = str(ev.get("type")), ev["object"]
                if initial is not None:
                    if kind != "BOOKMARK":
                        initial.append(obj)
                    elif INITIAL_EVENTS_END in ((obj.get("metadata") or {})
                                                .get("annotations") or {}):
                        self.tally.listed(initial, obj["metadata"]["resourceVersion"],
                                          time.monotonic())
                        initial = None
                    continue
                self.tally.event(kind, obj, time.monotonic())

    async def run(self) -> None:
        while True:
            try:
                if not self.tally.rv and not self.streaming and not await self._list():
                    await asyncio.sleep(0.5)
                    continue
                await self._watch()
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                self._error(type(exc).__name__)
                await asyncio.sleep(0.2)


async def timed_list(replicas: Replicas, after: float = 0.0) -> tuple[float, int, int, int]:
    """(seconds, status, items, attempts) of one list ``after`` s from now; a 503, 504 or
    429 (with Retry-After) is tried again a second later, as client-go does."""
    await asyncio.sleep(after)
    t0, attempts = time.monotonic(), 0
    while True:
        attempts += 1
        code, body = await replicas.list()
        if code not in (429, 503, 504) or time.monotonic() - t0 > 120:
            break
        await asyncio.sleep(1.0)
    items = len(body.get("items") or ()) if isinstance(body, dict) else 0
    return round(time.monotonic() - t0, 3), code, items, attempts


async def settle(replicas: Replicas, watchers: list[Watcher],
                 within: float, pulls: int) -> tuple[bool, dict[str, int]]:
    """Until a fresh list has ``pulls`` Done and every watcher's cache equals it (or
    ``within``); that list. (Versions alone passed a new leader's state from before
    its build: 6,092 of 50,000 Done, every cache equal to it.)"""
    deadline = time.monotonic() + within
    fresh: dict[str, int] = {}
    while True:
        code, body = await replicas.list()
        if code == 200 and isinstance(body, dict):
            items = body.get("items") or ()
            fresh = fresh_versions(items)
            done = sum((o.get("status") or {}).get("phase") == "Done" for o in items)
            if done >= pulls and all(w.tally.absent(fresh) == 0 for w in watchers):
                return True, fresh
        if time.monotonic() > deadline:
            return False, fresh
        await asyncio.sleep(2.0)
