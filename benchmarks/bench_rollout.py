"""Availability of the installed add-on while it loses a replica and while helm rolls it.

Needs the two-node cluster with the add-on installed (hack/local-up.sh). Measures, with
tests.framework.rollout's Prober (a loop of non-streaming requests through the aggregator,
and the APIService's Available condition):

1. ``helm install`` to Available=True: the release is uninstalled and installed again;
2. the loss of one replica: an apiserver pod deleted (``kubectl delete pod``), until its
   replacement is Ready;
3. ``helm upgrade`` to another image tag (the same image re-tagged on every node), until
   every pod is replaced and Ready; then back to the original tag.

Run: ``python3 -m benchmarks.bench_rollout [--instance local] [--skip-install]``. Prints
the figures, whether the goals hold (0 s unavailable, 0 failed requests), and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from tests.framework.addon import Addon, addon_of, running_cluster
from tests.framework.rollout import Prober, ProbeResult


def _row(name: str, seconds: float, r: ProbeResult) -> dict[str, Any]:
    ok = r.unavailable_seconds == 0 and not r.failures
    print(f"{name:24s} took {seconds:5.1f}s  unavailable {r.unavailable_seconds:4.1f}s  "
          f"failed {len(r.failures)}/{r.requests}  goal {'met' if ok else 'NOT met'}")
    for f in r.failures[:5]:
        print(f"    {f}")
    return {"seconds": round(seconds, 2), "unavailable_seconds": round(r.unavailable_seconds, 2),
            "requests": r.requests, "failed": len(r.failures), "goal_met": ok}


def lose_replica(a: Addon) -> dict[str, Any]:
    victim = a.apiserver_pods()[0]["metadata"]["name"]
    with Prober(a.cp, a.node_names()) as p:
        t0 = time.monotonic()
        a.kubectl("-n", a.namespace, "delete", "pod", victim, "--wait=false")
        a.wait_ready()
        took = time.monotonic() - t0
        time.sleep(2)
    return _row("loss of one replica", took, p.result)


def upgrade(a: Addon, tag: str | None, label: str) -> dict[str, Any]:
    """helm upgrade to local tag ``tag`` of the running image (None: the release's)."""
    if tag is not None and tag != a.image_tag:
        a.tag_image(tag)
    with Prober(a.cp, a.node_names()) as p:
        t0 = time.monotonic()
        a.upgrade(image_tag=tag)
        a.wait_ready()
        took = time.monotonic() - t0
        time.sleep(2)
    return _row(label, took, p.result)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    ap.add_argument("--skip-install", action="store_true",
                    help="keep the installed release (no uninstall/install timing)")
    args = ap.parse_args(argv)
    a = addon_of(running_cluster(args.instance))
    out: dict[str, Any] = {}
    if not args.skip_install:
        if a.installed():
            a.uninstall()
        a.load_image()
        a.remove_harness_objects()
        t = a.install()
        print(f"{'helm install':24s} {t.line()}")
        out["install"] = {"helm_seconds": round(t.helm, 2),
                          "available_seconds": round(t.available, 2),
                          "ready_seconds": round(t.ready, 2)}
    elif not a.installed():
        raise SystemExit("bench_rollout: aggapi is not installed (hack/local-up.sh)")
    original = a.image_tag
    out["lose_replica"] = lose_replica(a)
    out["helm_upgrade"] = upgrade(a, "bench-rollout", "helm upgrade (new tag)")
    out["helm_upgrade_back"] = upgrade(a, original, "helm upgrade (tag back)")
    goals = all(v.get("goal_met", True) for v in out.values())
    print(f"goals (0 s unavailable, 0 failed requests): {'met' if goals else 'NOT met'}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
