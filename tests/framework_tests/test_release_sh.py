"""hack/release.sh against a real docker-registry with htpasswd auth on 127.0.0.1 (no
cluster): what a user's registry gets, and what ``helm`` and ``cosign`` make of it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.addon import CHECKOUT_ARCHIVE, build_image
from tests.framework.kubetools import binary
from tests.framework.registry import Registry
from tests.framework.release import RegistryLogin, VerificationError, publish, verify

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def auth_registry(runtime_deps: None, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("authreg"), auth=("rel", "s3cret-pw")) as reg:
        yield reg


def test_release_sh_pushes_a_signed_chart_pinning_the_image_digest(
        auth_registry: Registry, tmp_path: Path) -> None:
    build_image()
    assert auth_registry.auth is not None
    login = RegistryLogin(auth_registry.host, *auth_registry.auth)
    rel = publish(login, CHECKOUT_ARCHIVE, tmp_path / "out")
    assert rel.image == f"{auth_registry.host}/aggapi@{rel.image_digest}"
    # The digest is the archive's own manifest (skopeo --preserve-digests).
    index = json.loads(subprocess.run(["tar", "-xOf", str(CHECKOUT_ARCHIVE), "index.json"],
                                      capture_output=True, check=True).stdout)
    assert [m["digest"] for m in index["manifests"]] == [rel.image_digest]
    # What a user pulls: the chart at its version, values naming the image by digest.
    cfg = tmp_path / "helm-registry.json"
    login.helm_login(cfg)
    values = subprocess.run([binary("helm"), "show", "values", rel.chart, "--version",
                             rel.chart_version, "--plain-http", "--registry-config", str(cfg)],
                            capture_output=True, text=True, check=True, timeout=120).stdout
    assert f"repository: {auth_registry.host}/aggapi\n" in values
    assert f'digest: "{rel.image_digest}"\n' in values
    rendered = subprocess.run([binary("helm"), "template", "aggapi", str(rel.package)],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    assert f"image: {rel.image}\n" in rendered
    for ref in (rel.image, rel.chart_by_digest):
        verify(rel, ref)
    with pytest.raises(VerificationError):  # a digest nothing was pushed as
        verify(rel, f"{auth_registry.host}/aggapi@sha256:{'0' * 64}")
    # Signed with this run's key only: another key refuses the same digest.
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run([binary("cosign"), "generate-key-pair"], cwd=other, check=True,
                   env={"COSIGN_PASSWORD": "x", "PATH": "/usr/bin:/bin"}, capture_output=True)
    with pytest.raises(VerificationError):
        verify(dataclasses.replace(rel, public_key=other / "cosign.pub"), rel.image)
