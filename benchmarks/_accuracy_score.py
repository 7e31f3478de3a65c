"""The bench's scoring of progress against the truth (bench_progress_accuracy): the
throttle's byte logs, the checks at 25/50/75% of an item's bytes, the figures and
goals. Pure: unit-tested in tests/test_bench_progress_accuracy.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20
FRACTIONS = (0.25, 0.5, 0.75)
WINDOW = 2.0  # real rate: the item's bytes in [T - WINDOW, T + WINDOW], not across a step
GOAL_ETA_MEDIAN = 0.15
GOAL_ETA_P90 = 0.30
GOAL_RATE = 0.15

# (time s, cumulative bytes of the item), time rising: from the throttle's record.
ByteLog = list[tuple[float, float]]
# The throttle writes ~1/20 s of the link at a time: a sample's bytes went out over at
# most this long before it (not over a whole stall since the previous sample).
SPREAD = 0.25


def _spread_start(log: ByteLog, i: int) -> float:
    return max(log[i - 1][0], log[i][0] - SPREAD)


def bytes_at(log: ByteLog, t: float) -> float:
    """The item's bytes sent by time ``t``: 0 before its first sample, its count after
    its last; each later sample's bytes spread evenly over the SPREAD before it."""
    i = bisect.bisect_right([s for s, _ in log], t)
    if i == 0:
        return 0
    if i == len(log):
        return log[-1][1]
    a = _spread_start(log, i)
    n0, (t1, n1) = log[i - 1][1], log[i]
    return n0 if t <= a else n0 + (n1 - n0) * (t - a) / (t1 - a)


def merge_logs(logs: Sequence[ByteLog]) -> ByteLog:
    """The cumulative bytes of several items together (an image from its layers, a pod
    from its images), at every point where any of them changes pace."""
    points: set[float] = set()
    for log in logs:
        points.update(s for s, _ in log)
        points.update(_spread_start(log, i) for i in range(1, len(log)))
    return [(t, sum(bytes_at(log, t) for log in logs)) for t in sorted(points)]


def time_at_fraction(log: ByteLog, fraction: float) -> float:
    """When the item's bytes reached ``fraction`` of its final count (as :func:`bytes_at`
    spreads them)."""
    if not log:
        raise ValueError("empty byte log")
    target = fraction * log[-1][1]
    i = bisect.bisect_left([n for _, n in log], target)
    if i == 0:
        return log[0][0]
    i = min(i, len(log) - 1)
    a = _spread_start(log, i)
    n0, (t1, n1) = log[i - 1][1], log[i]
    return a + (t1 - a) * (target - n0) / (n1 - n0) if n1 > n0 else t1


def real_rate(log: ByteLog, t: float, window: float = WINDOW,
              steps: Sequence[float] = ()) -> float | None:
    """Bytes/s of the item over [t - window, t + window], clipped to its first and last
    byte and to the side of ``t`` of every known step of its rate (``steps_for``; None
    if that leaves no time)."""
    start, end = log[0][0], log[-1][0]
    a, b = max(start, t - window), min(end, t + window)
    for s in steps:
        if s <= t:
            a = max(a, s)
        else:
            b = min(b, s)
    if b - a <= 1e-6:
        return None
    # At ``start`` the first sample's bytes are already out: count from just before.
    before = 0 if a <= start else bytes_at(log, a)
    return (bytes_at(log, b) - before) / (b - a)


def steps_for(flows: Sequence[ByteLog], mine: Collection[int]) -> tuple[float, ...]:
    """When the rate of the item made of ``flows[i]`` for i in ``mine`` can step: a flow
    on the link (every blob the throttle sent in the scenario) starting or ending (its
    first or last byte) while a flow not the item's runs then. The throttle splits the
    link among the flows it serves, so between such moments the item's rate holds; an
    item alone on the link (an image whose layers are all that flows) has the link's
    rate whichever of its own layers run."""
    spans = [(lg[0][0], lg[-1][0]) for lg in flows if lg]
    keep = [i for i, lg in enumerate(flows) if lg]
    out: set[float] = set()
    for s in {x for span in spans for x in span}:
        if any(a <= s <= b and i not in mine for i, (a, b) in zip(keep, spans, strict=True)):
            out.add(s)
    return tuple(sorted(out))


def peak_rate(log: ByteLog, span: float = MiB) -> float:
    """The link's highest rate over any ``span`` bytes (a step of containerd's): the
    throttle sends its first chunk at once (its bucket goes into debt), so the first
    MiB of a pull arrives faster than the limit (53 kB/s through 50 kB/s)."""
    pts = [(log[0][0], 0.0), *log] if log else []
    best, j = 0.0, 0
    for i, (ti, ni) in enumerate(pts):
        j = max(j, i + 1)
        while j < len(pts) and pts[j][1] - ni < span:
            j += 1
        if j == len(pts):
            break
        if pts[j][0] > ti:
            best = max(best, (pts[j][1] - ni) / (pts[j][0] - ti))
    return best


def latest_before(objs: Sequence[tuple[float, dict[str, Any]]], t: float
                  ) -> dict[str, Any] | None:
    """The last object received before ``t`` (``objs`` in order of receipt)."""
    i = bisect.bisect_left([r for r, _ in objs], t)
    return objs[i - 1][1] if i else None


def eta_error(eta: Any, remaining: float) -> float:
    """|eta - remaining| / remaining; a missing (None, negative) ETA counts as 1.0."""
    if not isinstance(eta, int | float) or isinstance(eta, bool) or eta < 0:
        return 1.0
    return abs(float(eta) - remaining) / max(remaining, 1e-3)


def rate_error(reported: Any, real: float | None, progress: Any = None) -> float | None:
    """|reported - real| / real; a missing rate counts as 1.0; None if no real rate, or
    if the rate is missing while the item's reported progress is still 0: nothing has
    moved on the node yet, so there is nothing to measure (issue 23: no made-up rate)."""
    if real is None or real <= 0:
        return None
    if reported is None and progress == 0:
        return None
    if not isinstance(reported, int | float) or isinstance(reported, bool) or reported < 0:
        return 1.0
    return abs(float(reported) - real) / real


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile, q in [0, 1]."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Check:
    """One item at one fraction of its bytes."""

    kind: str  # layer | image | pod
    item: str
    fraction: float
    at: float
    remaining: float
    real_rate: float | None
    said_rate: Any
    said_eta: Any
    eta_error: float
    rate_error: float | None
    # The reference before stop 41, [T-2 s, T+2 s] across known steps: kept beside it.
    centered_rate: float | None = None
    centered_error: float | None = None

    def row(self) -> dict[str, Any]:
        def r(x: float | None) -> int | None:
            return None if x is None else round(x)

        def e(x: float | None) -> float | None:
            return None if x is None else round(x, 4)
        return {"kind": self.kind, "item": self.item, "fraction": self.fraction,
                "remaining_s": round(self.remaining, 2), "real_rate": r(self.real_rate),
                "said_rate": self.said_rate, "said_eta": self.said_eta,
                "eta_error": round(self.eta_error, 4), "rate_error": e(self.rate_error),
                "real_rate_centered": r(self.centered_rate),
                "rate_error_centered": e(self.centered_error)}


def checks_for(kind: str, item: str, log: ByteLog,
               objs: Sequence[tuple[float, dict[str, Any]]],
               steps: Sequence[float] = ()) -> list[Check]:
    """``item``'s checks at :data:`FRACTIONS`; ``objs`` its stream objects (receipt time,
    object) in order; ``steps``: when its rate can step (``steps_for``)."""
    end = log[-1][0]
    out = []
    for f in FRACTIONS:
        t = time_at_fraction(log, f)
        o = latest_before(objs, t) or {}
        real, centered = real_rate(log, t, steps=steps), real_rate(log, t)
        said, progress = o.get("bytesPerSecond"), o.get("progress")
        out.append(Check(kind, item, f, t, end - t, real, said,
                         o.get("etaSeconds"), eta_error(o.get("etaSeconds"), end - t),
                         rate_error(said, real, progress), centered,
                         rate_error(said, centered, progress)))
    return out


def max_layer_rate(objs: Sequence[tuple[float, dict[str, Any]]]) -> float:
    """The highest bytesPerSecond any layer's Downloading object showed (0 if none)."""
    rates = [float(o["bytesPerSecond"]) for _, o in objs
             if o.get("kind") == "Progress" and o.get("layer")
             and o.get("phase") == "Downloading"
             and isinstance(o.get("bytesPerSecond"), int | float)]
    return max(rates, default=0.0)


def summarize(rows: Sequence[dict[str, Any]], layer_rate_over_link: float) -> dict[str, Any]:
    """Figures and goals of a set of checks (:meth:`Check.row`: a scenario's, or all),
    ``layer_rate_over_link`` the highest layer rate shown over the link's rate."""
    def etas(f: float) -> list[float]:
        return [float(r["eta_error"]) for r in rows if r["fraction"] == f]

    mid = etas(0.5)
    def rates(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r["kind"] in ("image", "pod")
                and r.get(key) is not None]

    out: dict[str, Any] = {
        "eta_error_median": quantile(mid, 0.5), "eta_error_p90": quantile(mid, 0.9),
        "rate_error_max": max(rates("rate_error"), default=math.nan),
        # Not a goal: the reference before stop 41, for comparison.
        "rate_error_max_centered": max(rates("rate_error_centered"), default=math.nan),
        "layer_rate_over_link": layer_rate_over_link,
    }
    for f in (0.25, 0.75):
        out[f"eta_error_median_at_{int(f * 100)}"] = quantile(etas(f), 0.5)
        out[f"eta_error_p90_at_{int(f * 100)}"] = quantile(etas(f), 0.9)
    # NaN (nothing measured) compares False: a goal with no figure is not met.
    out["goals"] = {
        "eta_median": out["eta_error_median"] <= GOAL_ETA_MEDIAN,
        "eta_p90": out["eta_error_p90"] <= GOAL_ETA_P90,
        "rate": out["rate_error_max"] <= GOAL_RATE,
        "layer_rate_within_link": layer_rate_over_link <= 1.0,
    }
    out["goal_met"] = all(out["goals"].values())
    return out
