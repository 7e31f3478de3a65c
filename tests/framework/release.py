"""A release of this checkout in a registry (hack/release.sh), and its checks as a user
runs them before installing.

    publish         hack/release.sh against a registry: the image by digest, the chart as
                    an OCI artifact, the SBOM, cosign signatures; returns the Release
    previous_chart  the chart of an earlier commit (PREVIOUS_CHART_COMMIT), extracted with
                    ``git archive``, to be published as PREVIOUS_CHART_VERSION: what the
                    upgrade e2e installs first
    verify          ``cosign verify --key`` of a reference (image or chart, by digest)
    RegistryLogin   a registry and its credentials: ``helm registry login`` into a
                    registry config file of the caller's, the dockerconfigjson of an
                    imagePullSecret
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.framework.kubetools import binary
from tests.framework.procs import HarnessError
from tests.framework.repo import REPO

RELEASE_SH = REPO / "hack/release.sh"
CHART_DIR = "manifests/charts/aggapi"
# The chart before its last change to the workloads (b1ab5f2: CPU limits dropped; the
# RBAC of podimagepulls and nodeimagepulls added), so an upgrade from it rolls both the
# Deployment and the DaemonSet. Chart.yaml said 0.1.0 then as now: it is published as
# 0.0.9. Its image is this checkout's (its args are unchanged since).
PREVIOUS_CHART_COMMIT = "d18a9be49927f46d90f05af7a87af7a3befec2b3"
PREVIOUS_CHART_VERSION = "0.0.9"


class VerificationError(HarnessError):
    """cosign refused a reference: nothing is installed from it."""


@dataclass(frozen=True)
class RegistryLogin:
    """A plain-HTTP registry (the harness's) and the one user it lets in."""

    host: str
    user: str
    password: str

    def dockerconfigjson(self) -> str:
        """The ``.dockerconfigjson`` of a kubernetes.io/dockerconfigjson Secret."""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"username": self.user,
                                                 "password": self.password,
                                                 "auth": token}}})

    def pull_secret(self, name: str, namespace: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                "metadata": {"name": name, "namespace": namespace},
                "data": {".dockerconfigjson":
                         base64.b64encode(self.dockerconfigjson().encode()).decode()}}

    def helm_login(self, registry_config: Path) -> None:
        """``helm registry login`` (password on stdin) into ``registry_config``."""
        registry_config.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([binary("helm"), "registry", "login", self.host, "--plain-http",
                            "--registry-config", str(registry_config), "--username", self.user,
                            "--password-stdin"], input=self.password, capture_output=True,
                           text=True, timeout=60, check=False)
        if r.returncode != 0:
            raise HarnessError(f"helm registry login {self.host}: {r.stderr.strip()}")


@dataclass(frozen=True)
class Release:
    """What hack/release.sh pushed (its release.json)."""

    registry: str
    chart: str            # oci://REGISTRY/charts/aggapi
    chart_version: str
    chart_digest: str
    image: str            # REGISTRY/aggapi@sha256:...
    image_digest: str
    sbom: Path
    public_key: Path
    package: Path
    out: Path

    @classmethod
    def load(cls, out: Path) -> Release:
        d = json.loads((out / "release.json").read_text())
        return cls(registry=d["registry"], chart=d["chart"], chart_version=d["chart_version"],
                   chart_digest=d["chart_digest"], image=d["image"],
                   image_digest=d["image_digest"], sbom=Path(d["sbom"]),
                   public_key=Path(d["public_key"]), package=Path(d["package"]), out=out)

    @property
    def chart_by_digest(self) -> str:
        """The chart's OCI artifact by digest, as cosign signs it (no oci:// scheme)."""
        return f"{self.chart.removeprefix('oci://')}@{self.chart_digest}"

    @property
    def auth_dir(self) -> Path:
        """The docker-style config hack/release.sh logged in with (cosign reads it)."""
        return self.out / "auth"


def publish(login: RegistryLogin, archive: Path, out: Path, *, chart: Path | None = None,
            chart_version: str | None = None, timeout: float = 900) -> Release:
    """hack/release.sh of ``archive`` to ``login``'s registry; output (keys, SBOM, the
    packaged chart, release.json) in ``out``. ``chart``: another chart directory than the
    checkout's, published as ``chart_version`` (default: its Chart.yaml's)."""
    env = {**os.environ, "REGISTRY_PASSWORD": login.password}
    extra = [*(["--chart", str(chart)] if chart else []),
             *(["--chart-version", chart_version] if chart_version else [])]
    r = subprocess.run(["bash", str(RELEASE_SH), "--registry", login.host, "--username",
                        login.user, "--plain-http", "--archive", str(archive), "--out", str(out),
                        *extra],
                       env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise HarnessError(f"hack/release.sh: exit {r.returncode}\n{r.stderr[-3000:]}")
    return Release.load(out)


def verify(release: Release, ref: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``cosign verify --key`` of ``ref`` (REGISTRY/repo@sha256:...) against the release's
    public key, no transparency log (the key signed offline). Raises VerificationError."""
    argv = [binary("cosign"), "verify", "--key", str(release.public_key),
            "--insecure-ignore-tlog=true", "--allow-http-registry", "--allow-insecure-registry",
            ref]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                       env={**os.environ, "DOCKER_CONFIG": str(release.auth_dir)})
    if r.returncode != 0:
        raise VerificationError(f"cosign verify {ref}: {r.stderr.strip()[-1500:]}")
    return r


def verify_release(release: Release) -> None:
    """The image and the chart, each by the digest the release names."""
    verify(release, release.image)
    verify(release, release.chart_by_digest)


def _kube_version(chart_yaml: str) -> str:
    m = re.search(r"(?m)^kubeVersion: (.+)$", chart_yaml)
    if m is None:
        raise HarnessError("Chart.yaml without kubeVersion")
    return m.group(1)


def previous_chart(dest: Path, commit: str = PREVIOUS_CHART_COMMIT) -> Path:
    """The chart at ``commit`` (``git archive``, so it needs the repository's history, not a
    shallow clone) as ``dest``/aggapi, its kubeVersion replaced by the checkout's: the
    earlier chart predates the v1.37 pin, and helm would refuse to install it on the
    harness's cluster. Nothing else of it changes."""
    r = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, CHART_DIR],
                       capture_output=True, timeout=60, check=False)
    if r.returncode != 0:
        raise HarnessError(f"git archive {commit} {CHART_DIR}: {r.stderr.decode().strip()} "
                           "(a shallow clone lacks it: git fetch --unshallow)")
    root = dest / "src"
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(root, filter="data")
    chart = root / CHART_DIR
    meta = chart / "Chart.yaml"
    old = meta.read_text()
    want = _kube_version((REPO / CHART_DIR / "Chart.yaml").read_text())
    meta.write_text(old.replace(f"kubeVersion: {_kube_version(old)}", f"kubeVersion: {want}"))
    return chart
