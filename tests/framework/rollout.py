"""Measuring the installed add-on while it loses a replica or rolls: what clients see.

:class:`Prober` runs in a thread during a disruption and records

- a loop of non-streaming requests through kube-apiserver's aggregator (discovery of the
  group, and the node view of each node, which goes on to that node's agent; optionally
  more, e.g. :func:`pod_probes`' snapshot, upload and download of a pod): how many were
  sent and which failed (a status or body its check refuses, or no answer within 5 s);
- the APIService's ``Available`` condition, polled: the seconds it was not True.

Used by tests/e2e/addon/test_faults.py, test_upgrade.py and ``python3 -m
benchmarks.bench_rollout``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.framework.controlplane import APISERVICE, GROUP, VERSION, ControlPlane


def ok_200(code: int, body: bytes) -> str:
    """The default check: 200, any body. Returns what is wrong ("" when nothing)."""
    return "" if code == 200 else f"{code} {body[:200]!r}"


@dataclass(frozen=True)
class Probe:
    """One request of the loop; ``check`` says what is wrong with an answer ("" if
    nothing). ``name`` groups the probes counted in ProbeResult.sent."""

    path: str
    name: str = "discovery"
    method: str = "GET"
    data: bytes | None = None
    check: Callable[[int, bytes], str] = ok_200


def pod_probes(namespace: str, pod: str, container: str, *, size: int = 64 << 10,
               file: str = "/tmp/aggapi-probe") -> list[Probe]:
    """Requests that reach ``pod``'s node agent with a capability token each: its
    imagepullprogress snapshot (follow=false, no Error object), an upload of ``size``
    bytes to ``file`` (the agent's sha256 must match) and its download (the same bytes)."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pods/{pod}"
    data = hashlib.sha256(pod.encode()).digest() * (size // 32)
    digest = hashlib.sha256(data).hexdigest()
    copy = f"{base}/copy?container={container}&path={file}"

    def snapshot(code: int, body: bytes) -> str:
        if code != 200:
            return f"{code} {body[:200]!r}"
        objs = [json.loads(line) for line in body.splitlines() if line.strip()]
        bad = [o for o in objs if o.get("kind") in ("Error", "Status")]
        return "" if objs and not bad else f"snapshot {body[:200]!r}"

    def uploaded(code: int, body: bytes) -> str:
        if code not in (200, 201):
            return f"{code} {body[:200]!r}"
        return "" if json.loads(body).get("sha256") == digest else f"upload {body[:200]!r}"

    def downloaded(code: int, body: bytes) -> str:
        if code != 200:
            return f"{code} {body[:200]!r}"
        return "" if body == data else f"download of {len(body)} bytes differs"

    return [Probe(f"{base}/imagepullprogress?follow=false", "progress", check=snapshot),
            Probe(copy, "upload", "POST", data, uploaded),
            Probe(copy, "download", check=downloaded)]


@dataclass
class ProbeResult:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    unavailable_seconds: float = 0.0
    seconds: float = 0.0
    # Requests sent per Probe.name.
    sent: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        return (f"{self.requests} requests in {self.seconds:.1f}s, {len(self.failures)} failed; "
                f"APIService not Available for {self.unavailable_seconds:.1f}s")


class Prober:
    """``with Prober(cp, nodes) as p: ...disrupt...`` then ``p.result``."""

    def __init__(self, cp: ControlPlane, nodes: list[str], *, interval: float = 0.1,
                 extra: Sequence[Probe] = (), workers: int = 1) -> None:
        self.cp = cp
        self.probes = [Probe(f"/apis/{GROUP}/{VERSION}"),
                       *(Probe(f"/apis/{GROUP}/{VERSION}/nodes/{n}/imagepulls", "node view")
                         for n in nodes), *extra]
        self.interval = interval
        # Loops sending at once, each starting at another probe: a short window in which
        # a replica or agent refuses is hit more often than by one loop.
        self.workers = workers
        self.result = ProbeResult()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _requests(self, i: int = 0) -> None:
        while not self._stop.is_set():
            probe = self.probes[i % len(self.probes)]
            i += 1
            t = time.monotonic()
            try:
                code, body = self.cp.request(probe.method, probe.path, probe.data, timeout=5)
                err = probe.check(code, body)
            except (OSError, ValueError) as e:  # ValueError: a body that is not JSON
                err = f"{type(e).__name__}: {e}"
            with self._lock:
                self.result.requests += 1
                self.result.sent[probe.name] += 1
                if err:
                    self.result.failures.append(
                        f"+{t - self._t0:.1f}s {probe.method} {probe.path}: {err}")
            self._stop.wait(self.interval)

    def _available(self) -> bool:
        try:
            code, body = self.cp.get(
                f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}", timeout=5)
        except OSError:
            return False
        if code != 200:
            return False
        conds = json.loads(body).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)

    def _availability(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            ok = self._available()
            now = time.monotonic()
            if not ok:
                with self._lock:
                    self.result.unavailable_seconds += now - last
            last = now
            self._stop.wait(0.2)

    def __enter__(self) -> Prober:
        self._t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._availability, daemon=True),
                         *(threading.Thread(target=self._requests, args=(w,), daemon=True)
                           for w in range(self.workers))]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self.result.seconds = time.monotonic() - self._t0
