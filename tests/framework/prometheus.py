"""A real Prometheus (hack/build-binaries.sh prometheus) as a host process of a test.

It discovers and scrapes the installed add-on as the chart's ServiceMonitor makes
prometheus-operator do: Kubernetes service discovery of the EndpointSlices of one
Service (through kube-apiserver, with the harness's admin kubeconfig), then HTTPS to each
endpoint's pod IP (the host routes every node's pod CIDR), a bearer token, and the
``node`` label from the pod's node. Rule files are given by the test (the chart's rendered
PrometheusRule groups). It listens on 127.0.0.1 only and is stopped by its PID.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.framework.kubetools import binary
from tests.framework.procs import Proc, free_port, spawn, wait_ready


@dataclass(frozen=True)
class Target:
    """One Service's endpoints scraped as a ServiceMonitor endpoint would be."""

    job: str
    namespace: str
    service: str
    port: str  # the EndpointSlice port's name
    # The serving certificate verified against this CA for this name (else, as for the
    # agents' ephemeral identities, not verified).
    ca_file: Path | None = None
    server_name: str = ""


def config(targets: Sequence[Target], *, kubeconfig: Path, token_file: Path,
           interval: float, rule_files: Sequence[str] = ()) -> dict[str, Any]:
    """prometheus.yml: one job per target, scraped every ``interval`` seconds, rules
    evaluated as often."""
    every = f"{int(interval * 1000)}ms"
    return {
        "global": {"scrape_interval": every, "scrape_timeout": every,
                   "evaluation_interval": every},
        "rule_files": list(rule_files),
        "scrape_configs": [{
            "job_name": t.job,
            "scheme": "https",
            "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "tls_config": _tls(t),
            "kubernetes_sd_configs": [{"role": "endpointslice",
                                       "kubeconfig_file": str(kubeconfig),
                                       "namespaces": {"names": [t.namespace]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_service_name",
                                   "__meta_kubernetes_endpointslice_port_name"],
                 "regex": f"{t.service};{t.port}", "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_node_name"],
                 "target_label": "node"},
            ],
        } for t in targets],
    }


def _tls(t: Target) -> dict[str, Any]:
    if t.ca_file is None:
        # As the chart's agent ServiceMonitor with ephemeral serving identities: each
        # agent's certificate is pinned by the apiservers, not by a CA Prometheus has.
        return {"insecure_skip_verify": True}
    return {"ca_file": str(t.ca_file), "server_name": t.server_name}


class Prometheus:
    """``prometheus`` with ``cfg`` (and ``files`` written beside it) in ``workdir``."""

    def __init__(self, workdir: Path, cfg: Mapping[str, Any],
                 files: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            (workdir / name).write_text(text)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(dict(cfg)))
        self.proc: Proc | None = None

    def start(self, timeout: float = 30.0) -> Prometheus:
        self.proc = spawn("prometheus", [
            binary("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}"], self.workdir)
        wait_ready(lambda: self._ok("/-/ready"), timeout, "prometheus ready", self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def log(self, n: int = 30) -> str:
        return self.proc.tail(n) if self.proc is not None else ""

    def _ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> Any:
        qs = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{qs}", timeout=10) as r:
            body = json.loads(r.read())
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{metric: {...}, value: [ts, "v"]}]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        out: list[dict[str, Any]] = data["result"]
        return out

    def samples(self, expr: str) -> list[tuple[Mapping[str, str], list[tuple[float, float]]]]:
        """A range selector's raw samples, each series' (scrape time, value) pairs."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "matrix", data
        return [(s["metric"], [(float(t), float(v)) for t, v in s["values"]])
                for s in data["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return out

    def targets_up(self, job: str) -> list[dict[str, Any]]:
        return [t for t in self.api("targets", state="active")["activeTargets"]
                if t["labels"].get("job") == job and t["health"] == "up"]
