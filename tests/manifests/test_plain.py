"""The plain manifests: rendered from the chart (never edited by hand), and installable
with kustomize from `aggapi certs` output."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from aggapi.tls import certs
from tests.manifests.conftest import BASE, REPO, find


def test_committed_plain_manifests_equal_a_fresh_render(helm: str) -> None:
    r = subprocess.run(["bash", str(REPO / "hack/gen-manifests.sh"), "--check"],
                       capture_output=True, text=True, timeout=120,
                       env={"AGGAPI_HELM_BIN": helm, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, (
        f"stale manifests/base (run hack/gen-manifests.sh):\n{r.stdout}{r.stderr}")


def test_plain_manifests_parse_and_are_listed() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files
    for f in files:
        docs = [d for d in yaml.safe_load_all((BASE / f).read_text()) if d]
        assert docs, f
        for d in docs:
            assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl"
            assert d["kind"] != "Secret", "the plain manifests must not carry key material"


def _kubectl() -> str:
    # The kubectl built from the pinned module first: PATH's may be minors older.
    k = str(REPO / ".local/bin/kubectl")
    if not Path(k).exists():
        k = shutil.which("kubectl") or k
    if not Path(k).exists():
        pytest.skip("kubectl not found")
    return k


def test_kustomize_install_overlay(tmp_path: Path) -> None:
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    out = tmp_path / "manifests/install/certs"
    certs.generate(out)
    r = subprocess.run([_kubectl(), "kustomize", str(tmp_path / "manifests/install")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    api = find(docs, "APIService")
    assert base64.b64decode(api["spec"]["caBundle"]) == (out / "ca.crt").read_bytes()
    sec = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    # No token signing key at rest: the replicas make theirs in memory.
    assert set(sec) == {"aggapi-apiserver-tls", "aggapi-agent-tls", "aggapi-agent-client-tls"}
    for s in sec.values():
        assert s["metadata"]["namespace"] == "aggapi"
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    assert "token-signing" not in yaml.safe_dump(docs)


def test_certs_dirs_are_gitignored() -> None:
    r = subprocess.run(["git", "check-ignore", "-q", "manifests/install/certs/ca.key"],
                       cwd=REPO, capture_output=True)
    assert r.returncode == 0, "manifests/install/certs/ must be ignored by git"
