"""What the scale harness measures: lists through the aggregator and page by page,
kube-apiserver's watches, aggapi's gauges, a replica's restart, and when the
simulation finished each pull (a mixin of :class:`tests.framework.scale.ScaleCluster`)."""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.framework.controlplane import AGGAPI_PORT, GROUP, VERSION, ControlPlane
from tests.framework.hollow import DONE_LOG
from tests.framework.procs import HarnessError, wait_ready


class ScaleMeasures:
    cp: ControlPlane  # ScaleCluster's field

    @property
    def hollow_dir(self) -> Path:
        return self.cp.state / "hollow"

    def list_podimagepulls(self, namespace: str = "") -> tuple[float, float, list[dict[str, Any]]]:
        """(seconds to the head, seconds to the last byte, items) of one list through
        the aggregator, as admin."""
        where = f"/namespaces/{namespace}" if namespace else ""
        t0 = time.monotonic()
        for _ in range(10):  # client-go retries a 503 with Retry-After (aggapi's: 1-2 s)
            code, head, took, body = self.cp.timed_get(
                f"/apis/{GROUP}/{VERSION}{where}/podimagepulls", timeout=60)
            if code != 503:
                break
            time.sleep(1.0)
        if code != 200:
            raise HarnessError(f"list podimagepulls{where}: {code} {body[:300]!r}")
        waited = time.monotonic() - t0 - took  # the 503s before, and the pauses
        return head + waited, took + waited, list(json.loads(body).get("items") or ())

    def list_pages(self, path: str, limit: int = 500) -> tuple[float, int]:
        """(seconds, items) of a complete list of ``path`` (from the root, as admin) in
        pages of ``limit``, as kubectl get and client-go's reflector list."""
        t0, items, cont = time.monotonic(), 0, ""
        sep = "&" if "?" in path else "?"
        while True:
            query = f"{sep}limit={limit}"
            if cont:
                query += f"&continue={urllib.parse.quote(cont)}"
            code, body = self.cp.get(path + query, timeout=60)
            if code != 200:
                raise HarnessError(f"list {path}: {code} {body[:300]!r}")
            page = json.loads(body)
            items += len(page.get("items") or ())
            cont = str((page.get("metadata") or {}).get("continue") or "")
            if not cont:
                return time.monotonic() - t0, items

    def kube_watches(self) -> dict[str, float]:
        """kube-apiserver's WATCH requests in flight, by resource."""
        code, body = self.cp.get("/metrics", timeout=20)
        if code != 200:
            raise HarnessError(f"kube-apiserver /metrics: {code}")
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
                res = re.search(r'resource="([^"]*)"', line)
                key = res.group(1) if res else ""
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def aggapi_metrics(self) -> dict[str, float]:
        """aggapi's own gauges (``aggapi_*``, unlabelled samples), read with the admin
        client certificate (aggapi authenticates the cluster CA's certificates)."""
        ctx = ssl.create_default_context(cafile=str(self.cp.aggapi_certs / "ca.crt"))
        ctx.load_cert_chain(self.cp.pki_dir / "admin.crt", self.cp.pki_dir / "admin.key")
        url = f"https://{self.cp.api_host.address}:{AGGAPI_PORT}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            text = r.read().decode()
        return {name: float(value) for name, value in
                (line.split(" ", 1) for line in text.splitlines()
                 if line.startswith("aggapi_") and "{" not in line.split(" ", 1)[0])}

    def restart_aggapi(self, wait: float = 90.0) -> float:
        """SIGTERM the aggapi apiserver (as a roll does) and start it again with the same
        flags, until the aggregator serves it and it is ready: the seconds that took.
        Its next list is the first of a replica that starts (or newly leads)."""
        t0 = time.monotonic()
        self.cp.proc("aggapi-apiserver").stop(timeout=30)
        self.cp.start_apiserver(wait=wait)
        # The harness's EndpointSlice is ready whatever the replica says; in a cluster
        # the chart's readinessProbe keeps it out of the Service (the aggregator then
        # answers 503) until its /readyz passes: wait for that as the aggregator would.
        wait_ready(self.aggapi_ready, wait, "aggapi /readyz")
        return time.monotonic() - t0

    def aggapi_ready(self) -> bool:
        """aggapi's /readyz, asked as kubelet's readinessProbe asks it."""
        ctx = ssl.create_default_context(cafile=str(self.cp.aggapi_certs / "ca.crt"))
        url = f"https://{self.cp.api_host.address}:{AGGAPI_PORT}/readyz"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
                return bool(r.status == 200)
        except OSError:  # (HTTPError too: 503 while not ready)
            return False

    def done_times(self, log: str = DONE_LOG) -> dict[tuple[str, str], float]:
        """When each pod's pull finished in the simulation (CLOCK_MONOTONIC); with
        ``hollow.POSTED_LOG``, when its Pulled Event was written."""
        path = self.hollow_dir / log
        out: dict[tuple[str, str], float] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                t, _, key = line.partition(" ")
                ns, _, name = key.partition("/")
                out.setdefault((ns, name), float(t))
        return out
