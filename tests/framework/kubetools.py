"""Binaries and kubeconfigs shared by the harness's Kubernetes components.

The control plane (tests.framework.controlplane), its controllers
(tests.framework.controllers) and the node's kubelet and kube-proxy all find their binary
and write their kubeconfig here, so none of them imports another for it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from tests.framework.procs import HarnessError
from tests.framework.repo import REPO

# --- binaries ------------------------------------------------------------------------

def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REPO / "hack/tools/versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


# The commands built from k8s.io/kubernetes: AGGAPI_KUBE_VERSION picks their release.
# kubectl too: kubectl supports one minor of skew to kube-apiserver, so it follows the
# release under test (AGGAPI_KUBECTL_BIN runs another one, e.g. the oldest the README
# claims for the plugins).
KUBE_CMDS = ("kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler",
             "kube-proxy", "kubectl")


def kube_version() -> str:
    """The Kubernetes release under test: AGGAPI_KUBE_VERSION, else the pin."""
    return os.environ.get("AGGAPI_KUBE_VERSION") or versions()["KUBE_VERSION"]


def kube_minor(version: str | None = None) -> int:
    """1.30 -> 30: what version-dependent flags and config fields are chosen by."""
    v = (version or kube_version()).removeprefix("v").split(".")
    if len(v) < 2 or v[0] != "1" or not v[1].isdigit():
        raise HarnessError(f"not a Kubernetes release: {version or kube_version()!r}")
    return int(v[1])


# The first minor that has each thing the harness uses and older releases lack: the
# harness leaves it out below that (see its use), and tests needing it skip with why.
SINCE: dict[str, int] = {
    # kube-apiserver --requestheader-uid-headers (KEP-4193 follow-up, 1.32).
    "apiserver-requestheader-uid": 32,
    # AuthenticationConfiguration.anonymous with per-path conditions (KEP-4633, beta 1.32).
    "apiserver-anonymous-conditions": 32,
    # kube-aggregator resolves Services through EndpointSlices (before: v1 Endpoints; seen
    # in k8s.io/kube-aggregator v0.30.4 vs v0.34.3, assumed from 1.33).
    "aggregator-endpointslices": 33,
    # KubeletConfiguration.failCgroupV1 (1.31): older kubelets run on cgroup v1 anyway.
    "kubelet-failCgroupV1": 31,
    # KubeletConfiguration.maxParallelImagePulls (KEP-3673, 1.27; GA 1.35).
    "kubelet-maxParallelImagePulls": 27,
    # Image volumes (KEP-4639): the ImageVolume gate exists (alpha 1.31, beta 1.33), and
    # is on by default (beta 1.35; GA and locked on in 1.36).
    "gate-ImageVolume": 31,
    "default-ImageVolume": 35,
    # kube-controller-manager without the cloud controllers (cloud-node-lifecycle,
    # node-route, service-lb): 1.37 refuses their names in --controllers (seen in v1.37.2).
    "kcm-without-cloud-controllers": 37,
    # kubelet checks that a pod may use an image pulled with credentials
    # (KubeletEnsureSecretPulledImages, KEP-2535): on by default from 1.35 (beta).
    "default-KubeletEnsureSecretPulledImages": 35,
}


def feature_gates() -> dict[str, bool]:
    """The feature gates the harness turns on for the release under test (kube-apiserver
    and every kubelet alike): ImageVolume where it exists but is off by default."""
    if has("gate-ImageVolume") and not has("default-ImageVolume"):
        return {"ImageVolume": True}
    return {}


def has(feature: str, version: str | None = None) -> bool:
    """Whether the Kubernetes release under test (or ``version``) has ``feature``."""
    return kube_minor(version) >= SINCE[feature]


def lacks(feature: str) -> str:
    """The skip reason for a test that needs ``feature`` on an older release."""
    return (f"Kubernetes {kube_version()} lacks {feature} "
            f"(since 1.{SINCE[feature]}; tests/framework/kubetools.py SINCE)")


def bin_cache() -> Path:
    return Path(os.environ.get("AGGAPI_BIN_CACHE") or "/var/cache/aggapi-bin")


def build_binaries(*names: str, kube_version: str | None = None) -> None:
    """Run hack/build-binaries.sh for ``names`` (cached ones are only linked);
    ``kube_version``: another Kubernetes release than the pin."""
    env = {**os.environ, "AGGAPI_KUBE_VERSION": kube_version} if kube_version else None
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), *names], check=True, env=env)


def binary(name: str, *, build: bool = True) -> str:
    """Path of a tool from hack/build-binaries.sh; runs it if the link is missing.

    AGGAPI_<NAME>_BIN names one binary outright. The Kubernetes commands are the cached
    <name>-<version> of the release under test, the pin's included: a .local/bin link
    left by an older pin would otherwise run the old release (the links stay on the pin,
    so a run for another release never moves them)."""
    env = os.environ.get(f"AGGAPI_{name.upper().replace('-', '_')}_BIN")
    if env:
        return env
    ver = kube_version()
    if name in KUBE_CMDS:
        cached = bin_cache() / f"{name}-{ver}"
        if not cached.exists() and build:
            build_binaries(name, kube_version=ver)
        fallback = REPO / ".local/bin" / name
        if name == "kubectl" and not cached.exists() and fallback.exists():
            # hack/build-binaries.sh linked a packaged kubectl: the build failed (it says so).
            return str(fallback)
        if not cached.exists():
            raise HarnessError(f"{name} {ver} not found: run AGGAPI_KUBE_VERSION={ver} "
                               f"hack/build-binaries.sh {name}")
        return str(cached)
    link = REPO / ".local/bin" / name
    if not link.exists() and build:
        build_binaries(name)
    if not link.exists():
        raise HarnessError(f"{name} not found: run hack/build-binaries.sh")
    return str(link)


# --- kubeconfig ----------------------------------------------------------------------

def kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "aggapi-local", "cluster": {
            "server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": user, "context": {"cluster": "aggapi-local", "user": user}}],
        "current-context": user,
    }, indent=2)
