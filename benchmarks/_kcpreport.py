"""``bench_kubectl_cp --installed``: the printed report of a variant and the --json
summary against the goals of issue 27."""

from __future__ import annotations

import os
from typing import Any

from benchmarks._kcpscenarios import TARGET_FS_TEXT, MiB

# Goals of issue 27: ncp over kubectl cp, both ways (no goal for "medium": reported).
GOALS = {"big": 2.0, "small": 1.0}


def report(label: str, r: dict[str, Any]) -> None:
    print(f"== {label} ({os.cpu_count()} CPUs, shared; load {os.getloadavg()[0]:.2f})")
    print(f"  files on {TARGET_FS_TEXT[r['target_fs']]} (--target-fs {r['target_fs']}), "
          f"settle {r['settle_s']:g} s before each directory upload")
    for k, p in r["pods"].items():
        lim = "no limit" if p["cpu_limit"] is None else f"limit {p['cpu_limit']:g} CPU"
        print(f"  {k:26s} {p['pod']} on {p['node']}, {lim}, "
              f"peak RSS {r['peak_rss_mib'].get(k, 0):.0f} MiB")
    for name, sc in r.items():
        if not isinstance(sc, dict) or "MiB_per_s" not in sc:
            continue
        print(f"{name}: {sc['files']} x {sc['file_bytes'] / MiB:g} MiB, best of {sc['rounds']}")
        for k, v in sc["MiB_per_s"].items():
            rounds = " ".join(f"{t:.2f}" for t in sc["seconds"][k])
            others = " ".join(f"{t:.1f}" for t in sc.get("unmeasured_cpu_s", {}).get(k, []))
            print(f"  {k:22s} {v:8.1f} MiB/s  ({min(sc['seconds'][k]):.2f} s; rounds {rounds}; "
                  f"unmeasured CPU-s {others})")
        procs: list[str] = []
        for used in sc["cpu_s_per_gib"].values():
            procs += [p for p in used if p not in procs]
        print("  CPU-s/GiB: " + " | ".join(p for p in procs) + " | total")
        for k, used in sc["cpu_s_per_gib"].items():
            print(f"    {k:22s}" + "".join(f"{used.get(p, 0.0):7.2f}" for p in procs)
                  + f"{sum(used.values()):8.2f}")
        for k, pods in sc["throttled"].items():
            hit = {p: t for p, t in pods.items() if t["periods"]}
            if hit:
                print(f"  throttled in {k}: " + ", ".join(
                    f"{p} {t['periods']}x {t['seconds']:.2f}s" for p, t in hit.items()))
        for way in ("up", "down"):
            goal = GOALS.get(name)
            verdict = ("" if goal is None else
                       f", goal {goal}x: {'met' if sc[f'{way}_ratio'] >= goal else 'NOT met'}")
            print(f"  {way}: ncp/kubectl cp {sc[f'{way}_ratio']:.2f}x throughput, "
                  f"{sc[f'{way}_cpu_ratio']:.2f}x CPU efficiency{verdict}")
        served = [k for k in sc["cpu_s_per_gib"].get("kubectl ncp upload", {})
                  if k.startswith("aggapi apiserver@")]
        for way in ("upload", "download"):
            used = sc["cpu_s_per_gib"].get(f"kubectl ncp {way}", {})
            if served:
                top = max(served, key=lambda k: used.get(k, 0.0))
                node = r["pods"][top]["node"]
                print(f"  ncp {way} served by {r['pods'][top]['pod']} on {node} "
                      f"(its CPU), agent on {r['pods']['agent']['node']}")


def goals(r: dict[str, Any]) -> dict[str, Any]:
    """The --json summary: ratios per scenario and whether the issue's goals are met."""
    out: dict[str, Any] = {name: {"up_ratio": sc["up_ratio"], "down_ratio": sc["down_ratio"],
                                  "up_cpu_ratio": sc["up_cpu_ratio"],
                                  "down_cpu_ratio": sc["down_cpu_ratio"]}
                           for name, sc in r.items()
                           if isinstance(sc, dict) and "up_ratio" in sc}
    out["goal_met"] = all(name in out and min(out[name]["up_ratio"], out[name]["down_ratio"])
                          >= goal for name, goal in GOALS.items())
    return out
