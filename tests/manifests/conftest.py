"""Helpers for the chart and plain-manifest tests: the real helm binary and rendering.

helm comes from hack/build-binaries.sh (cached in /var/cache/aggapi-bin): it is built on
first use when Go is available, so these tests run in CI; they skip, saying why, only
when no helm can be had.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.framework.repo import REPO

CHART = REPO / "manifests/charts/aggapi"
BASE = REPO / "manifests/base"
GROUP = "subresources.aggapi.io"
APISERVICE = f"v1alpha1.{GROUP}"

# Every TLS mode, with the values that select it (helm --set).
TLS_MODES: dict[str, list[str]] = {
    "helm": [],
    "certManager": ["tls.mode=certManager"],
    "certManager-issuer": ["tls.mode=certManager", "tls.certManager.issuerRef.name=corp-ca",
                           "tls.certManager.issuerRef.kind=ClusterIssuer"],
    "existingSecret": ["tls.mode=existingSecret", "tokenSigning.mode=existingSecret"],
}


@functools.cache
def tool_binary(name: str, env_var: str) -> str | None:
    """helm or helm-docs: $env_var, the .local/bin link, the newest cached build, or a
    build now (hack/build-binaries.sh NAME) when Go is available."""
    env = os.environ.get(env_var)
    if env:
        return env
    link = REPO / ".local/bin" / name
    if link.exists():
        return str(link)
    cache = Path(os.environ.get("AGGAPI_BIN_CACHE", "/var/cache/aggapi-bin"))
    built = sorted(cache.glob(f"{name}-v*")) if cache.is_dir() else []
    if built:
        return str(built[-1])
    if shutil.which("go") and not os.environ.get("AGGAPI_NO_BUILD"):
        r = subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), name],
                           capture_output=True, text=True)
        if r.returncode == 0 and link.exists():
            return str(link)
    return None


def tool_or_skip(name: str, env_var: str) -> str:
    """tool_binary's path, or the test skipped saying why (no Go toolchain, or
    AGGAPI_NO_BUILD set, so hack/build-binaries.sh NAME could not build one)."""
    path = tool_binary(name, env_var)
    if path is None:
        pytest.skip(f"no {name}: hack/build-binaries.sh {name} could not build one "
                    "(no Go toolchain or AGGAPI_NO_BUILD set)")
    return path


@pytest.fixture(scope="session")
def helm() -> str:
    return tool_or_skip("helm", "AGGAPI_HELM_BIN")


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool_or_skip("promtool", "AGGAPI_PROMTOOL_BIN")


# Render the chart as for a cluster that serves prometheus-operator's PrometheusRule.
PROMETHEUS_RULE_API = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]


def run_helm(helm: str, *args: str) -> str:
    r = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"helm {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


Render = Callable[..., list[dict[str, Any]]]


def render_chart(helm: str, sets: Sequence[str] = (), *, namespace: str = "aggapi",
                 release: str = "aggapi", extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace, *extra]
    for s in sets:
        args += ["--set", s]
    out = run_helm(helm, *args)
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def render(helm: str) -> Render:
    return functools.partial(render_chart, helm)


def find(docs: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def pod_spec(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind)["spec"]["template"]["spec"]
    return spec
