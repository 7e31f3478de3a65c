"""The aggregation path end to end, with a stand-in backend in aggapi's network namespace.

kube-apiserver -> aggregator (front-proxy client cert, X-Remote-* headers) -> EndpointSlice
address 10.251.N.2 (aggapi's netns) -> TLS verified against the APIService caBundle.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.controlplane import AGGAPI_PORT, ControlPlane
from tests.framework.procs import Proc, spawn

pytestmark = pytest.mark.e2e
BASE = "/apis/subresources.aggapi.io/v1alpha1"


@pytest.fixture(scope="module")
def standin(control_plane: ControlPlane) -> Iterator[Proc]:
    c = control_plane.aggapi_certs
    control_plane.stop_aggapi()  # the stand-in takes aggapi's address
    proc = spawn("standin-apiserver", [
        *control_plane.api_host.exec_prefix(), sys.executable,
        str(Path(__file__).with_name("standin_server.py")),
        control_plane.api_host.address, str(AGGAPI_PORT), str(c / "apiserver.crt"),
        str(c / "apiserver.key"), str(control_plane.pki_dir / "front-proxy-ca.crt"),
    ], control_plane.state)
    try:
        control_plane._wait(control_plane.apiservice_available, 60, "APIService Available",
                            proc)
        assert proc.alive(), proc.tail()
        yield proc
    finally:
        proc.stop()


def test_apiservice_becomes_available(control_plane: ControlPlane, standin: Proc) -> None:
    assert control_plane.apiservice_available()


def test_discovery_through_aggregator(control_plane: ControlPlane, standin: Proc) -> None:
    out = json.loads(control_plane.kubectl("get", "--raw", BASE).stdout)
    assert {r["name"] for r in out["resources"]} == {"pods/imagepullprogress", "pods/copy"}


def test_identity_arrives_as_request_headers(control_plane: ControlPlane,
                                             standin: Proc) -> None:
    path = f"{BASE}/namespaces/default/pods/p/imagepullprogress"
    out = json.loads(control_plane.kubectl("get", "--raw", path, user="alice").stdout)
    assert out["path"] == path
    assert out["peer"] == "front-proxy-client"
    assert out["user"] == "alice"
    assert "aggapi-e2e" in out["groups"] and "system:authenticated" in out["groups"]
    assert out["authorization"] is None  # stripped by the aggregator


def test_unauthenticated_never_reaches_backend(control_plane: ControlPlane,
                                               standin: Proc) -> None:
    code, _ = control_plane.get(f"{BASE}/namespaces/default/pods/p/imagepullprogress",
                                authenticated=False)
    assert code == 401


def test_rbac_is_checked_by_kube_apiserver_first(control_plane: ControlPlane,
                                                 standin: Proc) -> None:
    r = control_plane.kubectl("get", "--raw",
                              f"{BASE}/namespaces/default/pods/p/imagepullprogress",
                              user="mallory", check=False)
    assert r.returncode != 0 and "forbidden" in r.stderr.lower()
