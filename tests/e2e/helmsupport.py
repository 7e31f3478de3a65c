"""What the chart's e2e modules share (test_helm.py, test_helm_rbac.py,
test_helm_priority.py): the chart, helm as admin, rendered documents, waiting."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import yaml

from tests.framework.controlplane import ControlPlane, binary
from tests.framework.repo import REPO

CHART = REPO / "manifests/charts/aggapi"
GROUP = "subresources.aggapi.io"


def _helm(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([binary("helm"), f"--kubeconfig={cp.admin_kubeconfig}", *args],
                       capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"helm {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _ensure_namespace(cp: ControlPlane, ns: str) -> None:
    cp.kubectl("create", "namespace", ns, check=False)


def _wait(ok: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s")
