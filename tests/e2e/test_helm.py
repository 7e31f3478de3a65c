"""The shipped chart and plain manifests against the real kube-apiserver of the harness.

- every object of every TLS mode (and the kustomize overlay) passes server-side dry run;
- `helm install` into namespace aggapi succeeds, taking over the harness's objects, and the
  APIService stays Available with the locally running aggapi behind the harness Service;
- `helm upgrade` keeps the certificates helm generated;
- a user bound only through the aggregated roles gets exactly the documented access;
- the pods at the chart's default system-* priority classes are admitted in the release
  namespace, also by a kube-apiserver whose ResourceQuota admission limits those classes
  (as GKE's does), thanks to the chart's ResourceQuota.

No node runs here: no pods start (Deployments stay at 0 ready). ClusterRole aggregation
is kube-controller-manager's (it runs with the control plane). The module restores the
harness's objects when it is done (helm uninstall, then bootstrap()). The add-on installed
and running as pods is tests/e2e/addon/.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggapi.tls import certs
from tests.framework.controlplane import (
    APISERVICE,
    NAMESPACE,
    ControlPlane,
    binary,
)
from tests.framework.procs import Proc, free_port, spawn, wait_ready
from tests.framework.repo import REPO
from tests.manifests.conftest import TLS_MODES as CHART_TLS_MODES

pytestmark = pytest.mark.e2e

CHART = REPO / "manifests/charts/aggapi"
GROUP = "subresources.aggapi.io"
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
AGG = "rbac.authorization.k8s.io/aggregate-to-"


# --- helpers -------------------------------------------------------------------------------

def _helm(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([binary("helm"), f"--kubeconfig={cp.admin_kubeconfig}", *args],
                       capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"helm {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r


def _sets(values: Sequence[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


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


def _ensure_namespace(cp: ControlPlane, ns: str) -> None:
    cp.kubectl("create", "namespace", ns, check=False)


def _secret_data(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    out = json.loads(cp.kubectl("get", "secret", "-n", ns, name, "-o", "json").stdout)
    data: dict[str, str] = out["data"]
    return data


def _wait(ok: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s")


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


# --- RBAC through the aggregated roles -------------------------------------------------------

def _ssar(cp: ControlPlane, user: str, verb: str, resource: str, subresource: str = "",
          group: str = GROUP, namespace: str = "default", name: str = "x") -> bool:
    attrs = {"verb": verb, "group": group, "resource": resource, "name": name}
    if subresource:
        attrs["subresource"] = subresource
    if namespace:
        attrs["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attrs}}
    out = cp.kubectl("create", "--validate=false", "-o", "json", "-f", "-", user=user,
                     input=json.dumps(review))
    return bool(json.loads(out.stdout)["status"].get("allowed"))


def test_aggregated_roles_grant_exactly_the_documented_access(control_plane: ControlPlane) -> None:
    cp = control_plane
    release = "rbac-e2e"
    rendered = _docs(_helm(cp, "template", release, str(CHART), "-n", "aggapi-rbac",
                           "--show-only", "templates/rbac-aggregated.yaml").stdout)
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                    "items": rendered}))
    ours = {f"{release}-aggapi-view": "view", f"{release}-aggapi-edit": "edit"}
    # kube-controller-manager's clusterrole-aggregation controller copies our rules into
    # the built-in view, edit and admin (by the aggregate-to-* labels): nothing is
    # aggregated here, the users below are bound to the built-in roles themselves.
    rules_of: dict[str, list[Any]] = {"view": [], "edit": [], "admin": []}
    for d in rendered:
        for target in rules_of:
            if (d["metadata"].get("labels") or {}).get(AGG + target) == "true":
                rules_of[target] += d["rules"]
    # ...and the node collection's reader, aggregated to cluster readers (not to view).
    reader = f"{release}-aggapi-node-image-pulls-reader"
    assert set(ours) | {reader} == {d["metadata"]["name"] for d in rendered}
    assert not any((d["metadata"].get("labels") or {}).get(AGG + t) == "true"
                   for d in rendered if d["metadata"]["name"] == reader
                   for t in rules_of)
    assert all(rules_of.values())

    def aggregated() -> bool:
        for target, rules in rules_of.items():
            role = json.loads(cp.kubectl("get", "clusterrole", target, "-o", "json").stdout)
            if not all(r in (role.get("rules") or []) for r in rules):
                return False
        return True

    _wait(aggregated, 60, "view/edit/admin aggregated by kube-controller-manager")

    objs: list[dict[str, Any]] = []
    users = {"agg-viewer": "view", "agg-editor": "edit", "agg-admin": "admin"}
    for user, target in users.items():
        cp.add_user(user)
        objs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": f"e2e-aggregated-{user}"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": target},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                           "name": user}]},
        ]
    # view granted in one namespace only (the usual RoleBinding): no cluster-scoped access.
    cp.add_user("agg-ns-viewer")
    cp.add_user("agg-nobody")
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "e2e-aggregated-ns-viewer", "namespace": "default"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "view"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                               "name": "agg-ns-viewer"}]})
    cp.apply(objs)

    verbs = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
    progress = {"get", "watch"}
    copy = {"get", "create", "watch"}
    expect: dict[str, dict[str, set[str]]] = {
        "agg-viewer": {"imagepullprogress": progress, "copy": set(), "imagepulls": {"get"}},
        "agg-editor": {"imagepullprogress": progress, "copy": copy, "imagepulls": {"get"}},
        "agg-admin": {"imagepullprogress": progress, "copy": copy, "imagepulls": {"get"}},
        "agg-ns-viewer": {"imagepullprogress": progress, "copy": set(), "imagepulls": set()},
        "agg-nobody": {"imagepullprogress": set(), "copy": set(), "imagepulls": set()},
    }
    failures = []
    for user, want in expect.items():
        for verb in verbs:
            got = {
                "imagepullprogress": _ssar(cp, user, verb, "pods", "imagepullprogress"),
                "copy": _ssar(cp, user, verb, "pods", "copy"),
                "imagepulls": _ssar(cp, user, verb, "nodes", "imagepulls", namespace=""),
            }
            for sub, allowed in got.items():
                if allowed != (verb in want[sub]):
                    failures.append(f"{user} {verb} {sub}: allowed={allowed}")
        # Outside the RoleBinding's namespace the namespaced viewer has nothing.
        if user == "agg-ns-viewer":
            assert not _ssar(cp, user, "get", "pods", "imagepullprogress", namespace="kube-system")
    assert not failures, "\n".join(failures)
    # Every copy also needs create on core pods/exec: edit and admin have it, view not.
    assert _ssar(cp, "agg-editor", "create", "pods", "exec", group="")
    assert not _ssar(cp, "agg-viewer", "create", "pods", "exec", group="")


# --- system priority classes -----------------------------------------------------------------

def _pods_of(rendered: list[dict[str, Any]], ns: str) -> list[dict[str, Any]]:
    """A Pod per workload, as its controller would create it (no controller runs here)."""
    pods = []
    for d in rendered:
        if d["kind"] in ("Deployment", "DaemonSet"):
            tpl = d["spec"]["template"]
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": d["metadata"]["name"] + "-probe",
                                      "namespace": ns, "labels": tpl["metadata"]["labels"]},
                         "spec": tpl["spec"]})
    return pods


def _dry_run_pods(kubectl: Any, pods: list[dict[str, Any]]) -> list[str]:
    """The admission errors of each pod's server-side dry run ('' when admitted)."""
    errors = []
    for pod in pods:
        r = kubectl("create", "--dry-run=server", "-o", "name", "-f", "-",
                    input=json.dumps(pod), check=False)
        errors.append("" if r.returncode == 0 else r.stderr.strip())
    return errors


LIMITED = """apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: [system-node-critical, system-cluster-critical]
"""


def test_default_priority_classes_are_admitted(control_plane: ControlPlane,
                                               tmp_path: Path) -> None:
    cp = control_plane
    ns = "aggapi-priority"
    rendered = _docs(_helm(cp, "template", "aggapi", str(CHART), "-n", ns).stdout)
    classes = {p["spec"]["priorityClassName"] for p in _pods_of(rendered, ns)}
    assert classes == {"system-node-critical", "system-cluster-critical"}
    accounts = [d for d in rendered if d["kind"] == "ServiceAccount"]

    # 1. The stock kube-apiserver admits them outside kube-system (since 1.17).
    _ensure_namespace(cp, ns)
    cp.apply(accounts)
    assert _dry_run_pods(cp.kubectl, _pods_of(rendered, ns)) == ["", ""]

    # 2. A kube-apiserver whose ResourceQuota admission limits these classes (GKE's
    # setting): admitted with the chart's ResourceQuota, refused without one. It shares
    # etcd under a prefix of its own, so the harness's objects are not touched.
    cfg = tmp_path / "admission.yaml"
    cfg.write_text(LIMITED)
    port = free_port(cp.net.host_address)
    args = [a for a in cp.kube_apiserver_args()
            if not a.startswith(("--secure-port=", "--cert-dir="))]
    args += [f"--secure-port={port}", f"--cert-dir={tmp_path / 'certs'}",
             "--etcd-prefix=/aggapi-e2e-limited-priority",
             f"--admission-control-config-file={cfg}"]
    server = f"https://{cp.net.host_address}:{port}"

    def kubectl(*a: str, input: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}",
                            f"--server={server}", *a], input=input, text=True,
                           capture_output=True, timeout=120)
        assert r.returncode == 0 or not check, f"kubectl {' '.join(a)}: {r.stderr}"
        return r

    proc = spawn("kube-apiserver-limited-priority", args, cp.state)
    try:
        wait_ready(lambda: kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
                   120, "kube-apiserver with limited priority classes", proc)
        # The system classes are created by a post-start hook; wait for them.
        wait_ready(lambda: kubectl("get", "priorityclass", "system-node-critical",
                                   check=False).returncode == 0, 60, "system priority classes")
        quota = next(d for d in rendered if d["kind"] == "ResourceQuota")
        for space, with_quota in ((ns, True), ("aggapi-priority-bare", False)):
            kubectl("create", "namespace", space)
            for sa in accounts:
                kubectl("create", "-f", "-", input=json.dumps(
                    {**sa, "metadata": {**sa["metadata"], "namespace": space}}))
            if with_quota:
                kubectl("create", "-f", "-", input=json.dumps(quota))
                # What kube-controller-manager's quota controller would record (none runs
                # here; admission refuses pods while a quota has no status).
                kubectl("patch", "resourcequota", "-n", space, quota["metadata"]["name"],
                        "--subresource=status", "--type=merge", "-p", json.dumps(
                            {"status": {"hard": quota["spec"]["hard"],
                                        "used": {"pods": "0"}}}))
            errors = _dry_run_pods(kubectl, _pods_of(rendered, space))
            if with_quota:
                assert errors == ["", ""], errors
            else:
                assert all("insufficient quota to match these scopes" in e for e in errors), \
                    errors
    finally:
        proc.stop()
