"""Do nodes pulling at once share one link? Told from their bytes while they pull.

Each agent reads the bytes its containerd has received (``sockbytes``) at wall-clock
ticks (``aggapi.agent.progress.linkticks``: every ``TICK`` s, the same instants on every
node whose clock is set) and shows the last seconds of them in its node view. On one
shared bottleneck the link hands its bytes to one flow or another, so within a tick the
nodes' counts move against each other while their sum keeps the link's pace; on links
of their own each node's count moves on its own. Over the last ``WINDOW`` s of ticks
every node has:

    R = var(sum of the nodes' bytes per tick) / sum of var(each node's bytes per tick)

is near 0 on one link and near 1 on links of their own (above 1 when a common cause
slows both). Measured (notes s39/linkcov), through the bench's throttle and through a
kernel token bucket (tbf in a netns, MTU-sized packets): one link judged 4-5 s after
both start in 40 of 42 recorded pulls, links of their own in none of 42.
Read by the ticks' own instants, not interpolated: two agents polling on their own
phases blur exactly the movement that tells (R near 1 either way).

One link is judged only when every node's count moved by itself (each node's
coefficient of variation at least ``MOVING``: steady counts say nothing) and R is at
most ``ONE_LINK``; anything else judges nothing (a false "one link" is worse than
none). Pure: the caller gives the series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

TICK = 0.25  # seconds between an agent's reads (the agents' own constant)
WINDOW = 5.0  # seconds of ticks judged
MIN_STEPS = 16  # ticks every node has, at least (of WINDOW / TICK)
MOVING = 0.05  # each node's bytes per tick: coefficient of variation at least
ONE_LINK = 0.2  # R at most: one link
MAX_SAMPLES = 64  # read of a view's series, at most
OFF_TICK = 0.02  # seconds a sample may lie off its tick (a late read is dropped)

Series = dict[int, float]  # tick index (round(t / TICK)) -> bytes received so far


def series_of(view: Mapping[str, Any] | None) -> Series:
    """A node view's ``linkTicks`` samples ([[wall seconds, bytes so far], ...]) by tick
    index; anything malformed, off its tick or not finite is left out."""
    raw = (view or {}).get("linkTicks")
    out: Series = {}
    if not isinstance(raw, list):
        return out
    for s in raw[-MAX_SAMPLES:]:
        if not (isinstance(s, list) and len(s) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in s)):
            continue
        t, n = float(s[0]), float(s[1])
        if not (math.isfinite(t) and math.isfinite(n)) or n < 0:
            continue
        k = round(t / TICK)
        if abs(t - k * TICK) <= OFF_TICK:
            out[k] = n
    return out


def _var(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def ratio(series: Mapping[str, Series]) -> float | None:
    """R over the last ``WINDOW`` s of consecutive ticks every node has; None when
    there are too few, or a node's count did not move by itself (nothing to tell)."""
    if len(series) < 2:
        return None
    common = set.intersection(*(set(s) for s in series.values()))
    if not common:
        return None
    last = max(common)
    steps = [(k, k + 1) for k in range(last - round(WINDOW / TICK), last)
             if k in common and k + 1 in common]
    if len(steps) < MIN_STEPS:
        return None
    parts = [[s[b] - s[a] for a, b in steps] for s in series.values()]
    for p in parts:
        mean = sum(p) / len(p)
        if mean <= 0 or any(x < 0 for x in p) or math.sqrt(_var(p)) < MOVING * mean:
            return None
    spread = sum(_var(p) for p in parts)
    return _var([sum(x) for x in zip(*parts, strict=True)]) / spread if spread > 0 else None


def one_link(series: Mapping[str, Series]) -> tuple[bool, float | None]:
    """(one link judged, R): True only on clear evidence."""
    r = ratio(series)
    return (r is not None and r <= ONE_LINK), r
