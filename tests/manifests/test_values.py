"""The chart's placement and security values: each key lands where Kubernetes reads it,
wrong types are refused by values.schema.json, the system priority classes come with the
ResourceQuota that admits them, and tls.helm.lookup=false never mints keys per render."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.conftest import CHART, Render, find

KINDS = {"apiserver": "Deployment", "agent": "DaemonSet"}


def _values_file(tmp_path: Path, values: dict[str, Any]) -> list[str]:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return ["-f", str(f)]


def _pod(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    tpl: dict[str, Any] = find(docs, KINDS[component])["spec"]["template"]
    return tpl


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["infra"]}]}]}}}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "infra",
              "effect": "NoSchedule"}
ENV = {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}


@pytest.mark.parametrize("component", sorted(KINDS))
def test_every_new_key_lands_in_the_pod(render: Render, tmp_path: Path,
                                        component: str) -> None:
    values = {component: {
        "affinity": AFFINITY, "nodeSelector": {"pool": "infra"}, "tolerations": [TOLERATION],
        "podLabels": {"team": "platform"}, "podAnnotations": {"note": "x"},
        "priorityClassName": "infra-high", "podSecurityContext": {"fsGroup": 2000},
        "securityContext": {"readOnlyRootFilesystem": False}, "extraArgs": ["--log-level=debug"],
        "extraEnv": [ENV], "resources": {"requests": {"cpu": "7m"}}, "hostNetwork": True}}
    if component == "apiserver":
        values[component]["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "ScheduleAnyway"}]
    docs = render(extra=_values_file(tmp_path, values))
    tpl = _pod(docs, component)
    spec, c = tpl["spec"], tpl["spec"]["containers"][0]
    assert tpl["metadata"]["labels"]["team"] == "platform"
    assert tpl["metadata"]["labels"]["app.kubernetes.io/component"] == component
    assert tpl["metadata"]["annotations"]["note"] == "x"
    assert spec["affinity"]["nodeAffinity"] == AFFINITY["nodeAffinity"]
    assert spec["nodeSelector"]["pool"] == "infra"  # merged with the defaults
    assert TOLERATION in spec["tolerations"]
    assert spec["priorityClassName"] == "infra-high"
    assert spec["securityContext"]["fsGroup"] == 2000
    assert c["securityContext"]["readOnlyRootFilesystem"] is False
    assert c["args"][-1] == "--log-level=debug"
    assert ENV in c["env"]
    assert c["resources"]["requests"]["cpu"] == "7m"
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    if component == "apiserver":
        # The chart's own defaults merge under the overrides, and anti-affinity stays.
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "podAntiAffinity" in spec["affinity"]
        (tsc,) = spec["topologySpreadConstraints"]
        assert tsc["labelSelector"]["matchLabels"] == \
            find(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    else:
        # The chart's defaults merge under the override: explicit capabilities, never
        # privileged, no privilege escalation.
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "SYS_PTRACE" in sc["capabilities"]["add"]


def test_selector_labels_win_over_pod_labels(render: Render) -> None:
    docs = render(["agent.podLabels.app\\.kubernetes\\.io/component=other"])
    tpl = _pod(docs, "agent")
    assert tpl["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"


def test_affinity_with_its_own_anti_affinity_replaces_the_default(render: Render) -> None:
    own: dict[str, list[Any]] = {"preferredDuringSchedulingIgnoredDuringExecution": []}
    docs = render(extra=["--set-json",
                         "apiserver.affinity=" + json.dumps({"podAntiAffinity": own})])
    assert _pod(docs, "apiserver")["spec"]["affinity"] == {"podAntiAffinity": own}


@pytest.mark.parametrize("bad", [
    "apiserver.affinity=notamap",
    "agent.tolerations[0]=x",
    "apiserver.tolerations[0].operator=Maybe",
    "apiserver.topologySpreadConstraints[0].maxSkew=1",  # no topologyKey/whenUnsatisfiable
    "agent.podLabels.team=1",  # label values are strings
    "apiserver.priorityClassName=Not_A_Name",
    "agent.hostNetwork=yes",
    "apiserver.extraEnv[0].value=x",  # no name
    "agent.securityContext.privileged=sure",
    "apiserver.podSecurityContext.runAsUser=-1",
    "agent.podSecurityContext.noSuchField=true",
    "tls.helm.lookup=maybe",
    "serviceMonitor.authorization.credentials.name=x",  # no key
    "criticalPodsQuota.pods=0",
    "agent.metrics.port=70000",
])
def test_schema_refuses_wrong_types(helm: str, bad: str) -> None:
    r = subprocess.run([helm, "template", "x", str(CHART), "--set", bad],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, bad
    assert "values don't meet the specifications" in r.stderr, r.stderr


def test_priority_classes_default_as_metrics_server(render: Render) -> None:
    docs = render()
    assert _pod(docs, "agent")["spec"]["priorityClassName"] == "system-node-critical"
    assert _pod(docs, "apiserver")["spec"]["priorityClassName"] == "system-cluster-critical"
    quota = find(docs, "ResourceQuota", "aggapi-critical-pods")
    assert quota["metadata"]["namespace"] == "aggapi"
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expr == {"scopeName": "PriorityClass", "operator": "In",
                    "values": ["system-node-critical", "system-cluster-critical"]}
    # kube-system needs no quota; neither do other classes; and it can be turned off.
    for sets, ns in ((["criticalPodsQuota.create=false"], "aggapi"), ([], "kube-system"),
                     (["agent.priorityClassName=", "apiserver.priorityClassName=mine"],
                      "aggapi")):
        assert not [d for d in render(sets, namespace=ns) if d["kind"] == "ResourceQuota"]
    only_agent = find(render(["apiserver.priorityClassName="]), "ResourceQuota")
    assert only_agent["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [
        "system-node-critical"]
    assert "priorityClassName" not in _pod(render(["apiserver.priorityClassName="]),
                                           "apiserver")["spec"]


def _template(helm: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm, "template", "aggapi", str(CHART), "--namespace", "aggapi"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_lookup_off_never_regenerates_keys(helm: str) -> None:
    # Default (lookup on): helm template cannot look up, so each render mints new keys.
    assert _template(helm).stdout != _template(helm).stdout
    # lookup off with generated keys: refused, saying what to use instead.
    for sets in (["tls.helm.lookup=false"],
                 ["tls.helm.lookup=false", "tls.mode=certManager", "tokenSigning.mode=helm"],
                 ["tls.helm.lookup=false", "tls.mode=existingSecret",
                  "tokenSigning.mode=existingSecret"]):  # no caBundle
        r = _template(helm, *sets)
        assert r.returncode != 0 and "tls.helm.lookup=false" in r.stderr, (sets, r.stderr)
    # The modes that work without lookup render the same bytes every time.
    for sets in (["tls.helm.lookup=false", "tls.mode=certManager"],  # ephemeral token keys
                 ["tls.helm.lookup=false", "tls.mode=certManager",
                  "tokenSigning.mode=existingSecret"],
                 ["tls.helm.lookup=false", "tls.mode=existingSecret",
                  "tokenSigning.mode=existingSecret", "tls.existingSecret.caBundle=PEM"]):
        first, second = _template(helm, *sets), _template(helm, *sets)
        assert first.returncode == 0, first.stderr
        assert first.stdout == second.stdout


def test_agent_metrics_network_policy(render: Render) -> None:
    closed = find(render(), "NetworkPolicy", "aggapi-agent")
    assert [r["ports"] for r in closed["spec"]["ingress"]] == [[{"port": 10443,
                                                                 "protocol": "TCP"}]]
    peer = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    docs = render(extra=["--set-json", "networkPolicy.agentMetricsFrom=" + json.dumps([peer])])
    rules = find(docs, "NetworkPolicy", "aggapi-agent")["spec"]["ingress"]
    assert rules[1] == {"from": [peer], "ports": [{"port": 10445, "protocol": "TCP"}]}
