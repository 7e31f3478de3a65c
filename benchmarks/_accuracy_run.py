"""One bench_progress_accuracy scenario run: fresh images pushed, the pods created on
their nodes, the three watch streams of each read to the end, and the checks scored
against the throttle's record (BENCH_ACC_DUMP: everything kept for a closer look).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._accuracy_scenarios import Scenario
from benchmarks._accuracy_score import (
    ByteLog,
    Check,
    MiB,
    checks_for,
    max_layer_rate,
    merge_logs,
    peak_rate,
    steps_for,
    summarize,
)
from benchmarks._accuracy_stacks import ClusterStack, Stack, log
from tests.framework import oci
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.kubelet import forget_images, pod_manifest
from tests.framework.node import Node
from tests.framework.procs import follow_json_lines

GV = "/apis/subresources.aggapi.io/v1alpha1"


@dataclass
class Stream:
    """``kubectl get --raw`` of the /watch/ path at one granularity: (wall time, object)."""

    cp: ControlPlane
    pod: str
    granularity: str
    objects: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    def start(self) -> Stream:
        path = (f"{GV}/watch/namespaces/default/pods/{self.pod}/imagepullprogress"
                f"?granularity={self.granularity}")
        self.proc = subprocess.Popen(
            [binary("kubectl"), f"--kubeconfig={self.cp.admin_kubeconfig}", "get", "--raw",
             path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        follow_json_lines(self.proc, self.objects, clock=time.time)
        return self

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class PodRun:
    """One pod of a scenario: its image (fresh layers) and its three streams."""

    name: str
    ref: str  # as the pod spec names it (through the link)
    repo_tag: str
    blobs: list[oci.Blob]
    streams: dict[str, Stream] = field(default_factory=dict)


def push(node: Node, cache: oci.BlobCache, sc: Scenario, nonce: str, k: int
         ) -> tuple[str, list[oci.Blob]]:
    layers = [cache.random_layer(int(m * MiB), seed=f"acc-{sc.name}-{nonce}-{k}-{i}")
              for i, m in enumerate(sc.layers(k))]
    # A runnable container: a start failure is a kubelet "Failed" event, which would end
    # the streams early. The base is the sandbox (pause) image's own layer, from the
    # registry node's cache: already in every node's containerd (each runs pods), so it is
    # never fetched and only the random layers move.
    base = oci.BlobCache(node.cache_dir).busybox_layer()
    image = oci.build_image([base, *layers], cmd=["/bin/busybox", "sleep", "3600"],
                            labels={"io.aggapi.test": f"accuracy-{sc.name}"})
    repo = f"aggapi-bench/accuracy-{sc.name}-{k}"
    oci.push_image(node.info.registry_host, repo, image, nonce)
    return f"{repo}:{nonce}", [la.blob for la in layers]


def run_scenario(stack: Stack | ClusterStack, sc: Scenario, cache: oci.BlobCache, nonce: str
                 ) -> dict[str, Any]:
    cp, registry = stack.cp, stack.registry
    pushed = [push(registry, cache, sc, nonce, k) for k in range(1, sc.pods + 1)]
    names = [f"acc-{sc.name}-{k}" for k in range(1, sc.pods + 1)]
    where = stack.placement(sc)
    cp.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--ignore-not-found",
               check=False)
    timeout = 3 * sc.seconds + 90
    try:
        with stack.pulling_at_once(sc), stack.link(sc.rate) as proxy:
            pods = [PodRun(n, f"{proxy.host}/{rt}", rt, blobs)
                    for n, (rt, blobs) in zip(names, pushed, strict=True)]
            cp.kubectl("create", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "List", "items": [pod_manifest(
                    p.name, [{"name": "c", "image": p.ref}], node=node)
                    for p, (node, _) in zip(pods, where, strict=True)]}))
            for p in pods:
                p.streams = {g: Stream(cp, p.name, g).start()
                             for g in ("layer", "image", "pod")}
            streams = [s for p in pods for s in p.streams.values()]
            t0 = time.monotonic()
            try:
                while not all(s.ended() for s in streams):
                    if time.monotonic() - t0 > timeout:
                        log(f"{sc.name}: streams still open after {timeout:.0f}s")
                        break
                    time.sleep(0.5)
            finally:
                for s in streams:
                    s.stop()
            record = proxy.blob_log()
    finally:
        cp.kubectl("delete", "pod", *names, "--grace-period=0", "--force",
                   "--ignore-not-found", check=False)
    for p, (_, cri) in zip(pods, where, strict=True):
        with contextlib.suppress(Exception):
            asyncio.run(forget_images(cri, p.repo_tag))
    r = evaluate(sc, pods, record)
    r["path"] = stack.path
    r["nodes"] = [node for node, _ in where]
    return r


def _sent(sc: Scenario, b: oci.Blob, record: dict[str, Any]) -> ByteLog:
    """A blob's bytes as the throttle sent them: the attempt that finished, the one the
    pull's progress ends with."""
    fetches = record.get(b.digest) or []
    done = [f for f in fetches if f.received == b.size]
    if not done:
        raise RuntimeError(f"{sc.name}: blob {b.digest[:19]} never fully sent "
                           f"({[f.received for f in fetches]} of {b.size})")
    return [(wall, float(n)) for _, wall, n in done[-1].samples]


def evaluate(sc: Scenario, pods: Sequence[PodRun], record: dict[str, Any]) -> dict[str, Any]:
    checks: list[Check] = []
    finals: dict[str, dict[str, Any]] = {}
    objects: dict[str, dict[str, int]] = {}
    link_logs: list[ByteLog] = []
    layer_max = 0.0
    flows = [_sent(sc, b, record) for p in pods for b in p.blobs]  # every blob on the link
    retries = sum(max(0, len(record.get(b.digest) or []) - 1) for p in pods for b in p.blobs)
    first = 0  # the pod's first blob in ``flows``
    for p in pods:
        k = int(p.name.rsplit("-", 1)[1])
        tag = f"p{k} " if len(pods) > 1 else ""
        mine = range(first, first + len(p.blobs))
        logs, first = flows[first:first + len(p.blobs)], first + len(p.blobs)
        got = {g: s.objects for g, s in p.streams.items()}
        progress = {g: [(t, o) for t, o in objs if o.get("kind") == "Progress"]
                    for g, objs in got.items()}
        finals[p.name] = {g: next((o.get("kind") for _, o in reversed(objs)
                                   if o.get("kind") != "Progress"), None)
                          for g, objs in got.items()}
        objects[p.name] = {g: len(v) for g, v in got.items()}
        for i, (b, lg) in enumerate(zip(p.blobs, logs, strict=True)):
            objs = [(t, o) for t, o in progress["layer"] if o.get("layer") == b.digest]
            checks += checks_for("layer", f"{tag}L{i + 1} {sc.layers(k)[i]:g}MiB", lg, objs,
                                 steps_for(flows, {mine[i]}))
        image_log = merge_logs(logs)
        # One image per pod: its objects are the image stream's (named as the spec does).
        image_objs = [(t, o) for t, o in progress["image"] if o.get("image") == p.ref]
        steps = steps_for(flows, set(mine))
        checks += checks_for("image", f"{tag}image", image_log, image_objs, steps)
        checks += checks_for("pod", f"{tag}pod", image_log, progress["pod"], steps)
        link_logs.append(image_log)
        layer_max = max(layer_max, max_layer_rate(progress["layer"]))
    rows = [c.row() for c in checks]
    if dump := os.environ.get("BENCH_ACC_DUMP"):
        # Every object received and the throttle's record, for a closer look ("{scenario}"
        # in the name: one file per scenario).
        Path(dump.replace("{scenario}", sc.name)).write_text(json.dumps({
            "pods": {p.name: {g: s.objects for g, s in p.streams.items()} for p in pods},
            "logs": {b.digest: [(w, n) for _, w, n in (record.get(b.digest) or [])[-1].samples]
                     for p in pods for b in p.blobs}}, default=str))
    link_log = merge_logs(link_logs)
    all_bytes = link_log[-1][1]
    seconds = link_log[-1][0] - link_log[0][0]
    link_rate = max(float(sc.rate), all_bytes / seconds if seconds > 0 else 0.0,
                    peak_rate(link_log))
    return {"scenario": sc.name, "pods": sc.pods,
            "layers_mib": [list(sc.layers(k)) for k in range(1, sc.pods + 1)]
            if sc.other_pods_mib else list(sc.layers_mib),
            "link_rate": sc.rate, "containerd": sc.containerd,
            "pull_seconds": round(seconds, 2),
            "link_real_rate": round(all_bytes / seconds) if seconds > 0 else None,
            "retried_blob_gets": retries, "final_objects": finals, "objects": objects,
            "layer_rate_max": layer_max,
            "summary": summarize(rows, layer_max / link_rate),
            "checks": rows}
