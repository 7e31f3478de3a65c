"""The helm chart: lint and template per TLS mode, its values schema, release names.
The rest per concern: test_chart_rbac.py, test_chart_keys.py, test_chart_workloads.py."""

from __future__ import annotations

import pytest

from tests.manifests.conftest import APISERVICE, CHART, TLS_MODES, Render, find, pod_spec, run_helm


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_lint_and_template_every_tls_mode(helm: str, render: Render, mode: str) -> None:
    sets = TLS_MODES[mode]
    args = ["lint", "--strict", str(CHART), "--namespace", "aggapi"]
    for s in sets:
        args += ["--set", s]
    run_helm(helm, *args)
    docs = render(sets)
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "APIService"):
            assert d["metadata"].get("namespace"), f"{d['kind']} {d['metadata']['name']}"
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "DaemonSet", "Service", "APIService", "PodDisruptionBudget",
            "NetworkPolicy", "ClusterRole", "ClusterRoleBinding", "RoleBinding",
            "ServiceAccount"} <= kinds
    api = find(docs, "APIService", APISERVICE)
    if mode.startswith("certManager"):
        assert "caBundle" not in api["spec"]
        ann = api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert ann == "aggapi/aggapi-apiserver-tls"
        certs = [d for d in docs if d["kind"] == "Certificate"]
        assert {c["spec"]["secretName"] for c in certs} >= {
            "aggapi-apiserver-tls", "aggapi-agent-tls", "aggapi-agent-client-tls"}
        client = find(docs, "Certificate", "aggapi-agent-client-tls")
        assert client["spec"]["commonName"] == "aggapi-apiserver"
        if mode == "certManager-issuer":
            assert not [d for d in docs if d["kind"] == "Issuer"]
            assert client["spec"]["issuerRef"]["kind"] == "ClusterIssuer"
    if mode == "existingSecret":
        assert not [d for d in docs if d["kind"] in ("Secret", "Certificate")]


def test_values_schema_rejects_unknown_and_bad_values(helm: str) -> None:
    import subprocess

    for bad in ("tls.mode=selfsigned", "nosuchkey=1", "apiserver.replicas=0"):
        r = subprocess.run([helm, "template", "x", str(CHART), "--set", bad],
                           capture_output=True, text=True)
        assert r.returncode != 0, bad
        assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr, r.stderr


def test_release_name_changes_object_names(render: Render) -> None:
    docs = render(release="team-a", namespace="tools")
    names = {d["metadata"]["name"] for d in docs}
    assert {"team-a-aggapi", "team-a-aggapi-agent", "team-a-aggapi-view"} <= names
    api = find(docs, "APIService", APISERVICE)
    assert api["spec"]["service"] == {"name": "team-a-aggapi", "namespace": "tools",
                                      "port": 443}
    args = pod_spec(docs, "Deployment")["containers"][0]["args"]
    assert "--agent-service=team-a-aggapi-agent" in args
    assert "--agent-namespace=tools" in args
