"""The pods at the chart's default system-* priority classes are admitted in the release
namespace by the real kube-apiserver of the harness, also by a kube-apiserver whose
ResourceQuota admission limits those classes (as GKE's does), thanks to the chart's
ResourceQuota. No node runs here: the pods are dry-run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helmsupport import CHART, _docs, _ensure_namespace, _helm
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.procs import free_port, spawn, wait_ready

pytestmark = pytest.mark.e2e

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
