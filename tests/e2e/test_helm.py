"""The shipped chart and plain manifests against the real kube-apiserver of the harness.

- every object of every TLS mode (and the kustomize overlay) passes server-side dry run;
- `helm install` into namespace aggapi succeeds, taking over the harness's objects, and the
  APIService stays Available with the locally running aggapi behind the harness Service;
- `helm upgrade` keeps the certificates helm generated.

The aggregated roles: test_helm_rbac.py; the system-* priority classes:
test_helm_priority.py.

No node runs here: no pods start (Deployments stay at 0 ready). The module restores the
harness's objects when it is done (helm uninstall, then bootstrap()). The add-on installed
and running as pods is tests/e2e/addon/.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from aggapi.tls import certs
from tests.e2e.helmsupport import CHART, GROUP, _docs, _ensure_namespace, _helm, _wait
from tests.framework.controlplane import APISERVICE, NAMESPACE, ControlPlane
from tests.framework.procs import Proc
from tests.framework.repo import REPO
from tests.manifests.conftest import TLS_MODES as CHART_TLS_MODES

pytestmark = pytest.mark.e2e

# The chart tests' TLS modes, plus the optional ServiceMonitor.
TLS_MODES: dict[str, list[str]] = {**CHART_TLS_MODES,
                                   "serviceMonitor": ["serviceMonitor.enabled=true"],
                                   # The opt-in apiserver NetworkPolicy, every peer kind.
                                   "apiserverNetworkPolicy": [
                                       "networkPolicy.apiserver.enabled=true",
                                       "networkPolicy.apiserver.from[0].ipBlock.cidr="
                                       "10.0.0.0/28",
                                       "networkPolicy.apiserver.metricsFrom[0]"
                                       ".namespaceSelector.matchLabels.team=monitoring"],
                                   # Every placement and security value at once.
                                   "placement": [
                                       "apiserver.hostNetwork=true", "agent.hostNetwork=true",
                                       "apiserver.podLabels.team=infra",
                                       "agent.podAnnotations.note=x",
                                       "apiserver.affinity.nodeAffinity"
                                       ".preferredDuringSchedulingIgnoredDuringExecution[0]"
                                       ".weight=1",
                                       "apiserver.affinity.nodeAffinity"
                                       ".preferredDuringSchedulingIgnoredDuringExecution[0]"
                                       ".preference.matchExpressions[0].key=pool",
                                       "apiserver.affinity.nodeAffinity"
                                       ".preferredDuringSchedulingIgnoredDuringExecution[0]"
                                       ".preference.matchExpressions[0].operator=Exists",
                                       "apiserver.topologySpreadConstraints[0].maxSkew=1",
                                       "apiserver.topologySpreadConstraints[0].topologyKey="
                                       "topology.kubernetes.io/zone",
                                       "apiserver.topologySpreadConstraints[0]"
                                       ".whenUnsatisfiable=ScheduleAnyway",
                                       "agent.tolerations[0].key=dedicated",
                                       "agent.tolerations[0].operator=Exists",
                                       "apiserver.extraEnv[0].name=HTTPS_PROXY",
                                       "apiserver.extraEnv[0].value=http://proxy:3128",
                                       "agent.podSecurityContext.fsGroup=0",
                                       "apiserver.securityContext.readOnlyRootFilesystem="
                                       "false",
                                       "networkPolicy.agentMetricsFrom[0].namespaceSelector"
                                       ".matchLabels.team=monitoring"],
                                   # GitOps: no lookup, cert-manager and a given token key.
                                   "noLookup": ["tls.helm.lookup=false", "tls.mode=certManager",
                                                "tokenSigning.mode=existingSecret"]}


# --- helpers -------------------------------------------------------------------------------


def _sets(values: Sequence[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def _crd(group: str, kind: str, plural: str, scope: str = "Namespaced") -> dict[str, Any]:
    """A permissive stand-in for a third-party CRD (its real schema is not ours to test)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": scope,
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                           "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


STUB_CRDS = [_crd("cert-manager.io", "Certificate", "certificates"),
             _crd("cert-manager.io", "Issuer", "issuers"),
             _crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors")]


def _secret_data(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    out = json.loads(cp.kubectl("get", "secret", "-n", ns, name, "-o", "json").stdout)
    data: dict[str, str] = out["data"]
    return data


@pytest.fixture(scope="module")
def restore(control_plane: ControlPlane) -> Iterator[list[tuple[str, str]]]:
    """Releases to uninstall at the end; then the harness's own objects come back."""
    releases: list[tuple[str, str]] = []
    yield releases
    for name, ns in releases:
        _helm(control_plane, "uninstall", name, "-n", ns, "--wait=false", check=False)
    control_plane.bootstrap()


# --- server-side validation -------------------------------------------------------------------


def test_every_rendered_object_passes_server_dry_run(control_plane: ControlPlane,
                                                     tmp_path: Path) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": STUB_CRDS}))
    for crd in STUB_CRDS:
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   f"crd/{crd['metadata']['name']}")
    ns = "aggapi-dryrun"
    _ensure_namespace(cp, ns)
    for mode, values in TLS_MODES.items():
        extra = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
        rendered = _helm(cp, "template", "aggapi", str(CHART), "-n", ns, *_sets(values),
                         *extra).stdout
        kinds = {d["kind"] for d in _docs(rendered)}
        if mode == "serviceMonitor":
            assert "ServiceMonitor" in kinds
        r = cp.kubectl("apply", "--dry-run=server", "--server-side", "--force-conflicts",
                       "--field-manager=aggapi-dryrun", "-f", "-", input=rendered, check=False)
        assert r.returncode == 0, f"mode {mode}:\n{r.stderr}"
        # Every object was sent: kubectl prints one line per object.
        assert len(r.stdout.strip().splitlines()) == len(_docs(rendered)), r.stdout

    # The plain manifests with the kustomize overlay, as `kubectl apply -k` sends them.
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    certs.generate(tmp_path / "manifests/install/certs")
    built = cp.kubectl("kustomize", str(tmp_path / "manifests/install")).stdout
    r = cp.kubectl("apply", "--dry-run=server", "--server-side", "--force-conflicts",
                   "--field-manager=aggapi-dryrun", "-f", "-", input=built, check=False)
    assert r.returncode == 0, r.stderr


# --- install, Available ------------------------------------------------------------------------


def _create_existing_secrets(cp: ControlPlane) -> None:
    c = cp.aggapi_certs
    objs: list[dict[str, Any]] = []

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    for name, leaf in [("aggapi-apiserver-tls", "apiserver"), ("aggapi-agent-tls", "agent"),
                       ("aggapi-agent-client-tls", "agent-client")]:
        objs.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                     "metadata": {"name": name, "namespace": NAMESPACE},
                     "data": {"tls.crt": b64(c / f"{leaf}.crt"), "tls.key": b64(c / f"{leaf}.key"),
                              "ca.crt": b64(c / "ca.crt")}})
    objs.append({"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "aggapi-token-signing", "namespace": NAMESPACE},
                 "data": {"tls.key": b64(c / "token-signing.key")}})
    objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "aggapi-token-public", "namespace": NAMESPACE},
                 "data": {"token-public.pem": (c / "token-signing.pub").read_text()}})
    cp.apply(objs)


def test_helm_install_and_apiservice_available(control_plane: ControlPlane,
                                               aggapi_apiserver: Proc,
                                               restore: list[tuple[str, str]]) -> None:
    cp = control_plane
    assert cp.apiservice_available()
    _create_existing_secrets(cp)
    # The harness's agent Service is a ClusterIP Service; ours is headless, and clusterIP
    # cannot change in place. Its EndpointSlice (node -> local agent) stays.
    cp.kubectl("delete", "service", "-n", NAMESPACE, "aggapi-agent", "--ignore-not-found")
    restore.append(("aggapi", NAMESPACE))
    _helm(cp, "install", "aggapi", str(CHART), "-n", NAMESPACE, "--take-ownership",
          *_sets(["tls.mode=existingSecret", "tokenSigning.mode=existingSecret"]))
    manifest = _docs(_helm(cp, "get", "manifest", "aggapi", "-n", NAMESPACE).stdout)
    api = next(d for d in manifest if d["kind"] == "APIService")
    # caBundle read back from the existing Secret at install time (lookup).
    assert base64.b64decode(api["spec"]["caBundle"]) == (cp.aggapi_certs / "ca.crt").read_bytes()

    live = json.loads(cp.kubectl("get", "apiservice", APISERVICE, "-o", "json").stdout)
    assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert live["spec"]["service"] == {"name": "aggapi", "namespace": NAMESPACE, "port": 443}
    # The harness's EndpointSlice still points the (now helm-owned) Service at the local
    # aggapi: the aggregator reaches it and keeps the APIService Available.
    _wait(cp.apiservice_available, 60, "APIService Available after helm install")
    code, body = cp.get(f"/apis/{GROUP}/v1alpha1")
    assert code == 200, body
    names = {r["name"] for r in json.loads(body)["resources"]}
    assert {"pods/imagepullprogress", "pods/copy"} <= names
    status = json.loads(_helm(cp, "status", "aggapi", "-n", NAMESPACE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    assert "kubectl get --raw" in status["info"]["notes"]

    _helm(cp, "uninstall", "aggapi", "-n", NAMESPACE)
    restore.remove(("aggapi", NAMESPACE))
    cp.bootstrap()
    _wait(cp.apiservice_available, 60, "APIService Available after restoring the harness")


# --- upgrade keeps generated certificates ---------------------------------------------------


GENERATED = ["aggapi-apiserver-tls", "aggapi-agent-tls", "aggapi-agent-client-tls",
             "aggapi-token-signing"]


def test_helm_upgrade_keeps_generated_certificates(control_plane: ControlPlane,
                                                  restore: list[tuple[str, str]]) -> None:
    cp = control_plane
    ns = "aggapi-upgrade"
    _ensure_namespace(cp, ns)
    restore.append(("aggapi", ns))
    # The APIService (cluster-scoped) is taken over from the harness for the duration.
    # tokenSigning.mode=helm: the generated token key must be kept too (the default,
    # ephemeral, generates none).
    helm_keys = ("--set", "tokenSigning.mode=helm")
    _helm(cp, "install", "aggapi", str(CHART), "-n", ns, "--take-ownership", *helm_keys)
    before = {n: _secret_data(cp, ns, n) for n in GENERATED}
    cm_before = json.loads(cp.kubectl("get", "configmap", "-n", ns, "aggapi-token-public",
                                      "-o", "json").stdout)["data"]
    _helm(cp, "upgrade", "aggapi", str(CHART), "-n", ns, "--set", "apiserver.replicas=3",
          *helm_keys)
    after = {n: _secret_data(cp, ns, n) for n in GENERATED}
    assert after == before
    cm_after = json.loads(cp.kubectl("get", "configmap", "-n", ns, "aggapi-token-public",
                                     "-o", "json").stdout)["data"]
    assert cm_after == cm_before
    api = json.loads(cp.kubectl("get", "apiservice", APISERVICE, "-o", "json").stdout)
    assert api["spec"]["caBundle"] == before["aggapi-apiserver-tls"]["ca.crt"]
    dep = json.loads(cp.kubectl("get", "deployment", "-n", ns, "aggapi", "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 3
    revs = json.loads(_helm(cp, "history", "aggapi", "-n", ns, "-o", "json").stdout)
    assert [r["revision"] for r in revs] == [1, 2]

    # Deleting one TLS Secret rotates all three from a new CA on the next upgrade.
    cp.kubectl("delete", "secret", "-n", ns, "aggapi-agent-tls")
    _helm(cp, "upgrade", "aggapi", str(CHART), "-n", ns, "--reuse-values")
    rotated = _secret_data(cp, ns, "aggapi-apiserver-tls")
    assert rotated["ca.crt"] != before["aggapi-apiserver-tls"]["ca.crt"]
    assert _secret_data(cp, ns, "aggapi-agent-tls")["ca.crt"] == rotated["ca.crt"]
    assert _secret_data(cp, ns, "aggapi-token-signing") == before["aggapi-token-signing"]

    _helm(cp, "uninstall", "aggapi", "-n", ns)
    restore.remove(("aggapi", ns))
    cp.bootstrap()
