"""The peaks of the watches aggapi holds on kube-apiserver and of kube-apiserver's WATCH
requests on pods and events, sampled while a test runs."""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
import threading
import urllib.request

from tests.framework.addon import Addon
from tests.framework.controlplane import APISERVICE


class WatchCounts:
    """Samples, every few seconds, the watches aggapi holds on kube-apiserver (its own
    gauge, summed over the apiserver replicas) and kube-apiserver's WATCH requests on
    pods and events; keeps the peaks. Best effort: a failed sample is skipped."""

    def __init__(self, addon: Addon, every: float = 5.0) -> None:
        self.addon, self.every = addon, every
        self.aggapi_peak = 0.0
        self.kube_peak = 0.0
        self.kube_before = self.kube_watches()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        ca = base64.b64decode(addon.get_json("apiservice", APISERVICE)["spec"]["caBundle"])
        self._ctx = ssl.create_default_context(cadata=ca.decode())
        self._ctx.check_hostname = False  # the serving certificate names the Service
        pki = addon.cp.pki_dir
        self._ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")

    def kube_watches(self) -> float:
        code, body = self.addon.cp.get("/metrics", timeout=20)
        if code != 200:
            return 0.0
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in body.decode().splitlines()
                   if ln.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in ln
                   and re.search(r'resource="(pods|events)"', ln))

    def aggapi_watches(self) -> float:
        total = 0.0
        for p in self.addon.apiserver_pods():
            ip = (p.get("status") or {}).get("podIP")
            if not ip:
                continue
            url = f"https://{ip}:8443/metrics"
            with urllib.request.urlopen(url, context=self._ctx, timeout=5) as r:
                m = re.search(r"^aggapi_apiserver_collection_watches (\S+)$",
                              r.read().decode(), re.M)
            total += float(m.group(1)) if m else 0.0
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.aggapi_peak = max(self.aggapi_peak, self.aggapi_watches())
                self.kube_peak = max(self.kube_peak, self.kube_watches())
            except (OSError, ValueError, subprocess.SubprocessError):
                continue

    def __enter__(self) -> WatchCounts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
