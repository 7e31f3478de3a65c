"""e2e fixtures: a real control plane (etcd + kube-apiserver) from aggapi.testing.controlplane.

Needs root (network namespaces) and the binaries of hack/build-binaries.sh, which the
``control_plane`` fixture builds on first use (cached in /var/cache/aggapi-bin afterwards).
Set AGGAPI_SKIP_E2E=1 to skip; AGGAPI_KEEP_E2E_STATE=1 keeps logs in .local/controlplane/e2e.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggapi.testing.controlplane import REPO, ControlPlane, Proc

APISERVER_MAIN = REPO / "aggapi/apiserver/main.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def _skip_reason() -> str | None:
    if os.environ.get("AGGAPI_SKIP_E2E"):
        return "AGGAPI_SKIP_E2E is set"
    if os.geteuid() != 0:
        return "e2e needs root (network namespaces)"
    if not shutil.which("ip"):
        return "e2e needs iproute2"
    return None


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                    "kube-apiserver"], check=True)
    built = time.monotonic() - t0
    cp = ControlPlane(instance="e2e")
    cp.down()  # leftovers of an interrupted run
    try:
        took = cp.up()
        print(f"\ncontrol plane: binaries {built:.1f}s, up {took:.1f}s")
        yield cp
    finally:
        cp.down(keep_state=bool(os.environ.get("AGGAPI_KEEP_E2E_STATE")))


@pytest.fixture(scope="module")
def aggapi_apiserver(control_plane: ControlPlane) -> Iterator[Proc]:
    """``aggapi apiserver`` running in its namespace, the APIService Available.

    Module-scoped: other modules may put a stand-in on the same address meanwhile.
    """
    if not APISERVER_MAIN.exists():
        pytest.skip("aggapi/apiserver/main.py not in the tree yet")
    proc = control_plane.start_apiserver()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def aggapi_agent(control_plane: ControlPlane) -> Iterator[Proc]:
    """``aggapi agent`` in the node's namespace, with no container runtime behind it.

    Enough to prove the apiserver -> agent leg (EndpointSlice nodeName, mTLS, token);
    tests that need containers start containerd and pass its socket themselves.
    """
    if not (REPO / "aggapi/agent/main.py").exists():
        pytest.skip("aggapi/agent/main.py not in the tree yet")
    missing = control_plane.state / "no-runtime.sock"
    proc = control_plane.start_agent(cri_socket=str(missing))
    try:
        yield proc
    finally:
        proc.stop()
