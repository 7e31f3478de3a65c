"""The chart's Grafana dashboard: the committed JSON is hack/dashboard.py's output, each
query parses under the real promtool and names only metrics the agent or the apiserver
exports or the chart's PrometheusRule records, and the ConfigMap carries the sidecar's label."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aggapi.agent.metrics import AgentMetrics
from aggapi.apiserver.metrics import Metrics
from tests.manifests.conftest import CHART, Render, find
from tests.manifests.conftest import PROMETHEUS_RULE_API as API

DASHBOARD = CHART / "dashboards" / "image-pulls.json"
GENERATOR = CHART.parents[2] / "hack" / "dashboard.py"


def queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_the_committed_dashboard_is_the_generators_output() -> None:
    out = subprocess.run([sys.executable, str(GENERATOR)], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == json.loads(DASHBOARD.read_text()), \
        "stale dashboard: run hack/gen-manifests.sh"


def test_every_query_parses_and_names_real_series(promtool: str, render: Render,
                                                  tmp_path: Path) -> None:
    exprs = queries()
    assert len(exprs) >= 7
    # Grafana's own variables are not PromQL: the range one as a plain duration.
    plain = [e.replace("$__rate_interval", "1m").replace("$node", ".*") for e in exprs]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"aggapi:dashboard_query_{i}", "expr": e} for i, e in enumerate(plain)]}]}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool, "check", "rules", "q.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    exported = set()
    for fam in [*AgentMetrics().registry.collect(), *Metrics().registry.collect()]:
        exported |= {s.name for s in fam.samples} | {fam.name}
        if fam.type == "counter":  # no sample yet for a labelled one: its _total name
            exported.add(fam.name + "_total")
    recorded = {r["record"] for g in find(render(["prometheusRule.enabled=true"], extra=API),
                                          "PrometheusRule")["spec"]["groups"]
                for r in g["rules"] if "record" in r}
    names = {n for e in plain for n in re.findall(r"\b(aggapi[_:][a-z0-9_:]+)", e)}
    # Histograms' _bucket series exist once observed; their family is exported.
    missing = {n for n in names if n not in exported | recorded
               and n.removesuffix("_bucket") not in exported}
    assert not missing


def test_configmap_only_when_enabled_with_the_sidecars_label(render: Render) -> None:
    assert not [d for d in render([]) if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].endswith("-dashboard")]
    docs = render(["grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring"])
    cm = find(docs, "ConfigMap", "aggapi-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["aggapi-image-pulls.json"]) == json.loads(
        DASHBOARD.read_text())


@pytest.mark.parametrize("label", ["grafana_dashboard", "dashboards.example/load"])
def test_the_label_is_a_value(render: Render, label: str) -> None:
    docs = render(["grafanaDashboard.enabled=true", f"grafanaDashboard.label={label}"])
    assert find(docs, "ConfigMap", "aggapi-dashboard")["metadata"]["labels"][label] == "1"
