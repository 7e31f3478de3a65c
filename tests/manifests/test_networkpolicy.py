"""The chart's NetworkPolicies (agents: only apiserver pods; apiserver: only the peers
listed for kube-apiserver, opt-in) and the server timeout flags it passes, rendered with
the real helm binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggapi.agent.config import from_args
from aggapi.apiserver.config import parse_args
from tests.manifests.conftest import CHART, Render, find

CIDR = "10.0.0.0/28"
ENABLE = ["networkPolicy.apiserver.enabled=true",
          f"networkPolicy.apiserver.from[0].ipBlock.cidr={CIDR}"]


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in docs if d["kind"] == "NetworkPolicy"}


def _pod_labels(docs: list[dict[str, Any]], kind: str) -> dict[str, str]:
    labels: dict[str, str] = find(docs, kind)["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_by_default_only_the_agent_policy(render: Render) -> None:
    docs = render()
    pols = _policies(docs)
    assert set(pols) == {"agent"}
    spec = pols["agent"]["spec"]
    assert _selects(spec["podSelector"], _pod_labels(docs, "DaemonSet"))
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert _selects(peer["podSelector"], _pod_labels(docs, "Deployment"))
    assert not _selects(peer["podSelector"], _pod_labels(docs, "DaemonSet"))
    assert rule["ports"] == [{"port": 10443, "protocol": "TCP"}]


def test_apiserver_policy_admits_only_the_listed_peers(render: Render) -> None:
    docs = render([*ENABLE, "apiserver.port=9443",
                   "networkPolicy.apiserver.metricsFrom[0].namespaceSelector.matchLabels"
                   ".team=monitoring"])
    pols = _policies(docs)
    assert set(pols) == {"agent", "apiserver"}
    spec = pols["apiserver"]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert _selects(spec["podSelector"], _pod_labels(docs, "Deployment"))
    assert not _selects(spec["podSelector"], _pod_labels(docs, "DaemonSet"))
    assert spec["ingress"] == [{
        "from": [{"ipBlock": {"cidr": CIDR}},
                 {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}},
                 # the other replicas, forwarding the collections to the leader
                 {"podSelector": {"matchLabels": _pod_labels(docs, "Deployment")}}],
        "ports": [{"port": 9443, "protocol": "TCP"}]}]
    ports = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["containerPort"] for p in ports] == [9443]


def test_network_policy_off_renders_none(render: Render) -> None:
    assert _policies(render(["networkPolicy.enabled=false", *ENABLE])) == {}


@pytest.mark.parametrize("sets", [
    ["networkPolicy.apiserver.enabled=true"],  # no peers: it would admit nobody
    [*ENABLE, "networkPolicy.apiserver.from[1].ipBlok.cidr=10.1.0.0/16"],
    ["agent.bodyIdleTimeout=-1"],
    ["apiserver.readHeaderTimeout=soon"],
])
def test_schema_refuses(helm: str, sets: list[str]) -> None:
    args = [helm, "template", "x", str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, sets
    assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr, r.stderr


def _args(docs: list[dict[str, Any]], kind: str) -> list[str]:
    args: list[str] = find(docs, kind)["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("sets,header,body", [
    ([], 10.0, 60.0),
    (["apiserver.readHeaderTimeout=3", "agent.readHeaderTimeout=4.5",
      "agent.bodyIdleTimeout=0"], None, 0.0),
])
def test_timeout_values_reach_both_binaries(render: Render, sets: list[str],
                                            header: float | None, body: float) -> None:
    docs = render(sets)
    api = _args(docs, "Deployment")
    assert api[0] == "apiserver"
    agent = _args(docs, "DaemonSet")
    assert agent[0] == "agent"
    # Parsed by the binaries' own flag parsers: the chart passes flags they accept.
    api_cfg = parse_args(api[1:], env={})
    agent_cfg = from_args(agent[1:])
    assert api_cfg.read_header_timeout == (header if header is not None else 3.0)
    assert agent_cfg.read_header_timeout == (header if header is not None else 4.5)
    assert agent_cfg.copy.body_idle_timeout == body


def _notes(helm: str, tmp_path: Path, sets: list[str]) -> str:
    """NOTES.txt as helm would print it: rendered through a copy of the chart."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = chart / "templates/NOTES.txt"
    (chart / "templates/_notes_under_test.tpl").write_text(
        '{{- define "notes.under.test" -}}' + notes.read_text() + "{{- end -}}")
    notes.unlink()
    (chart / "templates/notes.yaml").write_text(
        'notes: {{ include "notes.under.test" . | toJson }}\n')
    args = [helm, "template", "x", str(chart), "--show-only", "templates/notes.yaml"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    text: str = yaml.safe_load(r.stdout)["notes"]
    return text


def test_notes_say_what_the_policies_admit(helm: str, tmp_path: Path) -> None:
    assert "set networkPolicy.apiserver.enabled" in _notes(helm, tmp_path / "a", [])
    on = _notes(helm, tmp_path / "b", [*ENABLE, "serviceMonitor.enabled=true"])
    assert "admit only the peers in networkPolicy.apiserver.from" in on
    assert "no networkPolicy.apiserver.metricsFrom" in on
    off = _notes(helm, tmp_path / "c", ["networkPolicy.enabled=false"])
    assert "WARNING: networkPolicy.enabled is false" in off
