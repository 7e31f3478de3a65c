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


def binary(name: str, *, build: bool = True) -> str:
    """Path of a tool from hack/build-binaries.sh; runs it if the link is missing."""
    env = os.environ.get(f"AGGAPI_{name.upper().replace('-', '_')}_BIN")
    if env:
        return env
    link = REPO / ".local/bin" / name
    if not link.exists() and build:
        subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), name], check=True)
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
