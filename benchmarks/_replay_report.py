"""``bench_scale --replay``'s figures against issue 36's goals, printed met / NOT met."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def by_window(samples: list[tuple[float, float]], t0: float, step: float = 5.0
              ) -> list[list[float | int | None]]:
    """Update latency by when the pull ended: per ``step`` s from ``t0`` (the rollout's
    start), [start s, samples, p50, p99, max]. Says whether the tail is a leader
    change's gap or the whole run's pace."""
    bins: dict[int, list[float]] = {}
    for ended, lat in samples:
        bins.setdefault(int((ended - t0) // step), []).append(lat)
    return [[i * step, len(xs), pct(xs, 0.5), pct(xs, 0.99), pct(xs, 1.0)]
            for i, xs in sorted(bins.items())]


def dump_watchers(path: Path, t0: float, replicas: list[str], watchers: list[Any]) -> None:
    """For reading a run afterwards: each watcher's lists and watches (``timeline``)
    and when it first saw each Done, on the same clock as ``done.log``."""
    path.write_text(json.dumps({"t0": t0, "replicas": replicas, "watchers": [
        {"timeline": w.timeline, "done_at": w.tally.done_at} for w in watchers]}))


def done_times(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            t, _, key = line.partition(" ")
            out.setdefault(key, float(t))
    return out


# Issue 36's goals for 50,000 pods on 5,000 nodes over 3 replicas.
GOALS: list[tuple[str, str, Any]] = [
    ("first_list_s", "first complete list, all namespaces (s)", lambda v: v <= 3.0),
    ("update_p99_s", "update p99 (s, Pulled Event -> watchers)", lambda v: v <= 1.0),
    ("replica_cpu_mean_max", "replica CPU mean, max (cores)", lambda v: v < 1.0),
    ("replica_rss_peak_mib_max", "replica RSS peak, max (MiB)", lambda v: v < 1024),
    ("lost_events", "lost events (all watchers)", lambda v: v == 0),
    ("duplicate_events", "duplicate events (all watchers)", lambda v: v == 0),
]
BOUNDS = {"first_list_s": "<= 3", "update_p99_s": "<= 1", "replica_cpu_mean_max": "< 1",
          "replica_rss_peak_mib_max": "< 1024", "lost_events": "0", "duplicate_events": "0"}


def report(r: dict[str, Any]) -> bool:
    print(json.dumps(r, indent=1))
    print(f"goals (replay: {r['pods']} pods on {r['nodes']} nodes, {r['replicas']} replicas, "
          f"{r['watchers']} watchers; pulls started over {r['rollout_over_s']:g} s, "
          f"{r['pods'] / r['rollout_over_s']:.0f} a second):")
    met = []
    for key, text, ok in GOALS:
        value = r.get(key)
        good = value is not None and bool(ok(value))
        if key == "first_list_s":
            good = good and r["first_list_items"] == r["pods"]
        met.append(good)
        print(f"  {text:44s} {value!s:>12}  {'met' if good else 'NOT met'} ({BOUNDS[key]})")
    settled = r["settled"] and r["pulls_done"] == r["pods"] and all(
        n == r["pods"] for n in r.get("watcher_done_final", [r["pods"]]))
    print(f"  every pull done ({r['pulls_done']}/{r['pods']}), Done at every watcher and "
          f"every watcher equal to a fresh list: {'yes' if settled else 'NO'}")
    ok_all = all(met) and settled
    print(f"goal_met: {ok_all}")
    return ok_all
