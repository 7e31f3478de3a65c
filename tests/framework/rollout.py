"""Measuring the installed add-on while it loses a replica or rolls: what clients see.

:class:`Prober` runs in a thread during a disruption and records

- a loop of non-streaming requests through kube-apiserver's aggregator (discovery of the
  group, and the node view of each node, which goes on to that node's agent): how many
  were sent and which failed (any status but 200, or no answer within 5 s);
- the APIService's ``Available`` condition, polled: the seconds it was not True.

Used by tests/e2e/addon/test_faults.py and ``python3 -m benchmarks.bench_rollout``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from tests.framework.controlplane import APISERVICE, GROUP, VERSION, ControlPlane


@dataclass
class ProbeResult:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    unavailable_seconds: float = 0.0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.requests} requests in {self.seconds:.1f}s, {len(self.failures)} failed; "
                f"APIService not Available for {self.unavailable_seconds:.1f}s")


class Prober:
    """``with Prober(cp, nodes) as p: ...disrupt...`` then ``p.result``."""

    def __init__(self, cp: ControlPlane, nodes: list[str], *, interval: float = 0.1) -> None:
        self.cp = cp
        self.paths = [f"/apis/{GROUP}/{VERSION}",
                      *(f"/apis/{GROUP}/{VERSION}/nodes/{n}/imagepulls" for n in nodes)]
        self.interval = interval
        self.result = ProbeResult()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _requests(self) -> None:
        i = 0
        while not self._stop.is_set():
            path = self.paths[i % len(self.paths)]
            i += 1
            t = time.monotonic()
            try:
                code, body = self.cp.get(path, timeout=5)
                err = "" if code == 200 else f"{code} {body[:200]!r}"
            except OSError as e:
                err = f"{type(e).__name__}: {e}"
            with self._lock:
                self.result.requests += 1
                if err:
                    self.result.failures.append(f"+{t - self._t0:.1f}s {path}: {err}")
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
        self._threads = [threading.Thread(target=f, daemon=True)
                         for f in (self._requests, self._availability)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self.result.seconds = time.monotonic() - self._t0
