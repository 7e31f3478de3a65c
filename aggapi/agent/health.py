"""The agent's probes: /livez (the process answers) and /readyz (the runtime answers).

/readyz asks the runtime on the agent's own channels: a CRI ``Version`` and, unless
the agent runs CRI-only, containerd's ``Version`` service, each bounded by a short
timeout. Results are kept for a second or so: the kubelet's probes (and anyone
else's) must not turn into a stream of runtime calls. ``?verbose`` lists each check
as kube-apiserver does (``[+]cri ok`` / ``[-]containerd failed: reason``); a failure
always lists them, with status 500.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

Check = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Result:
    name: str
    error: str | None  # None: passed

    @property
    def ok(self) -> bool:
        return self.error is None


class ReadinessChecks:
    """Named runtime checks, run together, their results cached for ``ttl`` seconds.

    Concurrent probes while a round runs share it (one call per check per round).
    """

    def __init__(self, checks: Sequence[tuple[str, Check]], *, timeout: float = 2.0,
                 ttl: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.checks = tuple(checks)
        self.timeout = timeout
        self.ttl = ttl
        self.clock = clock
        self.rounds = 0  # how many times the runtime was asked (tests and benchmarks)
        self._results: tuple[float, list[Result]] | None = None
        self._lock = asyncio.Lock()

    async def _one(self, name: str, check: Check) -> Result:
        try:
            await asyncio.wait_for(check(), self.timeout)
        except TimeoutError:
            return Result(name, f"no answer within {self.timeout:g}s")
        except Exception as exc:  # any failure to answer is the reason shown to the probe
            return Result(name, str(exc) or type(exc).__name__)
        return Result(name, None)

    def _fresh(self) -> list[Result] | None:
        if self._results is not None and self.clock() < self._results[0]:
            return self._results[1]
        return None

    async def results(self) -> list[Result]:
        cached = self._fresh()
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._fresh()  # another probe ran the round while this one waited
            if cached is not None:
                return cached
            self.rounds += 1
            results = list(await asyncio.gather(*(self._one(n, c) for n, c in self.checks)))
            self._results = (self.clock() + self.ttl, results)
            return results


async def livez(_request: web.Request) -> web.Response:
    """The event loop answers: nothing else, so a slow runtime never restarts the agent."""
    return web.Response(text="ok")


def readyz(checks: ReadinessChecks, draining: Callable[[], bool] = lambda: False,
           ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``draining``: the agent got SIGTERM; it fails readiness at once (the
    EndpointSlices then send nothing new here) while its copies drain."""

    async def ready(request: web.Request) -> web.Response:
        results = await checks.results()
        if draining():
            results = [*results, Result("shutdown", "draining copies before stopping")]
        ok = all(r.ok for r in results)
        status = 200 if ok else 500
        # As kube-apiserver: the list only when asked, or when a check failed.
        if ok and "verbose" not in request.query:
            return web.Response(text="ok")
        lines = [f"[+]{r.name} ok" if r.ok else f"[-]{r.name} failed: {r.error}"
                 for r in results]
        lines.append("readyz check passed" if ok else "readyz check failed")
        return web.Response(text="\n".join(lines) + "\n", status=status)

    return ready
