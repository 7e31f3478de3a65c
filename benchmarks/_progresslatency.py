"""bench_progress's latency: when containerd first showed each offset of a pull, when each
/watch/ line arrived, and the percentiles of the difference."""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from aggapi.runtime.containerd import ContainerdClient
from benchmarks._copyrig import GV


def watch_path(pod: str, ns: str = "default") -> str:
    return f"{GV}/watch/namespaces/{ns}/pods/{pod}/imagepullprogress"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# --- containerd side: when did each offset first show up ------------------------------

@dataclass
class Tracker:
    """Polls ListStatuses; per layer digest, (monotonic time, offset) at each change."""

    client: ContainerdClient
    every: float
    seen: dict[str, tuple[list[float], list[int]]] = field(default_factory=dict)
    polls: int = 0
    poll_seconds: list[float] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            statuses = await self.client.list_statuses()
            t = time.monotonic()
            self.polls += 1
            self.poll_seconds.append(t - t0)
            for s in statuses:
                if not s.digest:
                    continue
                times, offsets = self.seen.setdefault(s.digest, ([], []))
                if not offsets or s.offset > offsets[-1]:
                    # The offset reached this value at some point in (t0, t]: t is when
                    # it was first visible to a caller of containerd.
                    times.append(t)
                    offsets.append(s.offset)
            await asyncio.sleep(max(0.0, self.every - (time.monotonic() - t0)))

    def first_at_least(self, digest: str, offset: int) -> float | None:
        entry = self.seen.get(digest)
        if entry is None:
            return None
        times, offsets = entry
        i = bisect.bisect_left(offsets, offset)
        return times[i] if i < len(offsets) else None


@dataclass
class LineLog:
    arrivals: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    first_line: asyncio.Event = field(default_factory=asyncio.Event)


async def read_stream(session: aiohttp.ClientSession, path: str, log: LineLog) -> None:
    async with session.get(path) as resp:
        assert resp.status == 200, (resp.status, await resp.text())
        async for line in resp.content:
            if line.strip():
                log.arrivals.append((time.monotonic(), json.loads(line)))
                log.first_line.set()


def latencies(log: LineLog, tracker: Tracker) -> tuple[list[float], int]:
    """(latency of each Downloading line whose progress moved, lines not matched)."""
    last: dict[str, int] = {}
    out: list[float] = []
    unmatched = 0
    for arrival, o in log.arrivals:
        layer, prog = str(o.get("layer") or ""), int(o.get("progress") or 0)
        if o.get("kind") != "Progress" or not layer.startswith("sha256:"):
            continue
        if o.get("phase") != "Downloading" or prog <= 0 or prog == last.get(layer):
            continue
        last[layer] = prog
        shown = tracker.first_at_least(layer, prog)
        if shown is None:
            unmatched += 1
            continue
        out.append(arrival - shown)
    return out, unmatched


def lat_summary(values: list[float], unmatched: int, lines: int) -> dict[str, float]:
    if not values:
        return {"lines": lines, "samples": 0, "unmatched": unmatched}
    return {"lines": lines, "samples": len(values), "unmatched": unmatched,
            "p50_s": pct(values, 50), "p90_s": pct(values, 90), "p99_s": pct(values, 99),
            "max_s": max(values), "mean_s": statistics.fmean(values)}
