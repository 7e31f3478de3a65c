"""bench_progress_accuracy's output: the per-scenario tables, the summaries, the JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks._accuracy_score import summarize


def fmt_rate(v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "null"
    return f"{v / 1000:.0f}k" if v < 1e6 else f"{v / 1e6:.2f}M"


def fmt_eta(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) and not isinstance(v, bool) else "null"


def pct(v: float | None) -> str:
    return "  n/a" if v is None or math.isnan(v) else f"{v:5.0%}"


def print_scenario(r: dict[str, Any]) -> None:
    print(f"\n== {r['scenario']}: {r['pods']} pod(s) on {r['nodes']}, layers "
          f"{r['layers_mib']} MiB, link {fmt_rate(r['link_rate'])}B/s, "
          f"containerd {r['containerd']}, {r['path']}; bytes flowed "
          f"{r['pull_seconds']} s at "
          f"{fmt_rate(r['link_real_rate'])}B/s; retried blob GETs {r['retried_blob_gets']}; "
          f"objects {r['objects']}; final {r['final_objects']}")
    # real: the ±2 s window on T's side of known steps; centred: across them (until s41).
    print(f"{'item':17} {'at':>4} {'rate said':>9} {'real':>8} {'err':>5} {'centred':>8} "
          f"{'err':>5}  {'ETA said':>8} {'real left':>9} {'err':>5}")
    for c in r["checks"]:
        print(f"{c['kind'][:5] + ' ' + c['item']:17.17} {c['fraction']:4.0%} "
              f"{fmt_rate(c['said_rate']):>9} {fmt_rate(c['real_rate']):>8} "
              f"{pct(c['rate_error'])} {fmt_rate(c.get('real_rate_centered')):>8} "
              f"{pct(c.get('rate_error_centered'))}  {fmt_eta(c['said_eta']):>8} "
              f"{c['remaining_s']:9.1f} {pct(c['eta_error'])}")
    print_summary(r["summary"], f"{r['scenario']}; max layer rate {fmt_rate(r['layer_rate_max'])}"
                  f"B/s")


def print_summary(s: dict[str, Any], label: str) -> None:
    g = s["goals"]

    def ok(b: bool) -> str:
        return "met" if b else "NOT met"

    print(f"-- {label}: ETA error at 50% median {pct(s['eta_error_median'])} (goal <= 15%: "
          f"{ok(g['eta_median'])}), p90 {pct(s['eta_error_p90'])} (goal <= 30%: "
          f"{ok(g['eta_p90'])}); at 25% median {pct(s['eta_error_median_at_25'])} p90 "
          f"{pct(s['eta_error_p90_at_25'])}, at 75% median {pct(s['eta_error_median_at_75'])}"
          f" p90 {pct(s['eta_error_p90_at_75'])}; image/pod rate error max "
          f"{pct(s['rate_error_max'])} (goal <= 15%: {ok(g['rate'])}; centred reference "
          f"{pct(s.get('rate_error_max_centered'))}); max layer rate / link "
          f"{s['layer_rate_over_link']:.2f} (goal <= 1: {ok(g['layer_rate_within_link'])})"
          f" -> goals {ok(s['goal_met'])}")


def overall(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [c for r in results for c in r["checks"]]
    over = max((float(r["summary"]["layer_rate_over_link"]) for r in results),
               default=math.nan)
    return summarize(rows, over)


def finite(v: Any) -> Any:
    """JSON has no NaN: nothing measured is null."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v
