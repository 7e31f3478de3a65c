"""The harness itself: a real kube-apiserver with aggapi's objects, as the aggregator sees it."""

from __future__ import annotations

import json

import pytest

from tests.framework.controlplane import (
    AGENT_SERVICE,
    APISERVER_SERVICE,
    APISERVICE,
    FRONT_PROXY_CN,
    NAMESPACE,
    ControlPlane,
    loopback_endpoints_rejected,
)
from tests.framework.kubetools import has, kube_version
from tests.framework.procs import Proc

pytestmark = pytest.mark.e2e


def test_kube_apiserver_ready(control_plane: ControlPlane) -> None:
    code, body = control_plane.get("/readyz?verbose")
    assert code == 200, body.decode()


def test_kubectl_works_with_admin_kubeconfig(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("get", "--raw", "/version").stdout)
    # The release under test (AGGAPI_KUBE_VERSION, else the pin), not just any binary.
    assert version["gitVersion"] == kube_version()
    nodes = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == [control_plane.node_name]
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_extension_apiserver_authentication_configmap(control_plane: ControlPlane) -> None:
    cm = json.loads(control_plane.kubectl(
        "get", "configmap", "-n", "kube-system", "extension-apiserver-authentication",
        "-o", "json").stdout)
    data = cm["data"]
    assert "BEGIN CERTIFICATE" in data["client-ca-file"]
    assert "BEGIN CERTIFICATE" in data["requestheader-client-ca-file"]
    assert json.loads(data["requestheader-allowed-names"]) == [FRONT_PROXY_CN]
    assert json.loads(data["requestheader-username-headers"]) == ["X-Remote-User"]
    assert json.loads(data["requestheader-group-headers"]) == ["X-Remote-Group"]
    assert json.loads(data["requestheader-extra-headers-prefix"]) == ["X-Remote-Extra-"]
    if has("apiserver-requestheader-uid"):
        assert json.loads(data["requestheader-uid-headers"]) == ["X-Remote-Uid"]
    else:  # aggapi then authenticates front-proxy users without a uid (test_authconfig)
        assert "requestheader-uid-headers" not in data
    front_proxy_ca = (control_plane.pki_dir / "front-proxy-ca.crt").read_text()
    assert data["requestheader-client-ca-file"].strip() == front_proxy_ca.strip()


def test_aggapi_names_what_the_release_lacks(control_plane: ControlPlane,
                                             aggapi_apiserver: Proc) -> None:
    """On a release without the uid header (before 1.32) aggapi serves without user UIDs
    and says so in its log; on newer ones it says nothing of the kind."""
    control_plane._wait(lambda: "authentication config loaded" in
                        aggapi_apiserver.logfile.read_text(errors="replace"), 30,
                        "aggapi read the authentication ConfigMap")
    text = aggapi_apiserver.logfile.read_text(errors="replace")
    said = "requestheader-uid-headers is not published" in text
    assert said is not has("apiserver-requestheader-uid"), text[-3000:]


def test_unauthenticated_request_is_401(control_plane: ControlPlane) -> None:
    code, _ = control_plane.get("/api/v1/namespaces", authenticated=False)
    assert code == 401
    code, _ = control_plane.get(f"/apis/{APISERVICE.split('.', 1)[1]}", authenticated=False)
    assert code == 401
    # Health endpoints stay open (anonymous restricted to them) where the release can
    # restrict anonymous to paths; before that the harness turns anonymous off.
    want = 200 if has("apiserver-anonymous-conditions") else 401
    assert control_plane.get("/readyz", authenticated=False)[0] == want


def test_user_kubeconfigs_and_rbac(control_plane: ControlPlane) -> None:
    ok = control_plane.kubectl("auth", "can-i", "get", "pods", "-n", "default", user="alice",
                               check=False)
    assert ok.stdout.strip() == "yes", ok.stderr
    no = control_plane.kubectl("get", "pods", "-n", "default", user="mallory", check=False)
    assert no.returncode != 0 and "Forbidden" in no.stderr
    who = control_plane.kubectl("auth", "whoami", "-o", "json", user="alice")
    info = json.loads(who.stdout)["status"]["userInfo"]
    assert info["username"] == "alice" and "aggapi-e2e" in info["groups"]


def test_agent_endpointslice_has_node_name(control_plane: ControlPlane) -> None:
    es = json.loads(control_plane.kubectl(
        "get", "endpointslices", "-n", NAMESPACE,
        "-l", f"kubernetes.io/service-name={AGENT_SERVICE}", "-o", "json").stdout)["items"]
    assert len(es) == 1
    ep = es[0]["endpoints"][0]
    assert ep["nodeName"] == control_plane.node_name
    assert ep["addresses"] == [control_plane.node_host.address]
    assert es[0]["ports"][0]["name"] == "https"


def test_apiservice_points_at_our_service(control_plane: ControlPlane) -> None:
    svc = json.loads(control_plane.kubectl("get", "apiservice", APISERVICE, "-o", "json").stdout)
    assert svc["spec"]["service"] == {"namespace": NAMESPACE, "name": APISERVER_SERVICE,
                                      "port": 443}
    ca = (control_plane.aggapi_certs / "ca.crt").read_bytes()
    import base64

    assert base64.b64decode(svc["spec"]["caBundle"]) == ca


def test_loopback_endpoint_addresses_are_refused(control_plane: ControlPlane) -> None:
    """The reason aggapi and the agent live in network namespaces (see netns.py)."""
    errors = loopback_endpoints_rejected(control_plane)
    assert errors["EndpointSlice"] and "loopback" in errors["EndpointSlice"]
    assert errors["Endpoints"] and "loopback" in errors["Endpoints"]


def test_apiservice_available(control_plane: ControlPlane, aggapi_apiserver: Proc) -> None:
    assert aggapi_apiserver.alive()
    assert control_plane.apiservice_available()


def test_discovery_lists_our_subresources(control_plane: ControlPlane,
                                              aggapi_apiserver: Proc) -> None:
    # `kubectl api-resources --api-group=subresources.aggapi.io` prints no row: it skips
    # subresources, and the group serves only pods/<sub>. Discovery itself holds them.
    out = control_plane.kubectl("api-resources", "--api-group=subresources.aggapi.io",
                                "--no-headers").stdout
    raw = json.loads(control_plane.kubectl(
        "get", "--raw", "/apis/subresources.aggapi.io/v1alpha1").stdout)
    names = {r["name"] for r in raw["resources"]}
    assert {"pods/imagepullprogress", "pods/copy"} <= names, (out, names)


def test_request_reaches_the_agent_of_the_pods_node(control_plane: ControlPlane,
                                                    aggapi_apiserver: Proc,
                                                    aggapi_agent: Proc) -> None:
    """kubectl -> kube-apiserver -> aggapi (netns api) -> agent (netns node) -> runtime.

    The agent has no runtime behind it: the error it reports names the socket it was given,
    which proves the request crossed every hop, mTLS and capability token included.
    """
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "harness-probe", "namespace": "default"},
           "spec": {"nodeName": control_plane.node_name,
                    "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}
    control_plane.apply([pod])
    r = control_plane.kubectl(
        "get", "--raw",
        "/apis/subresources.aggapi.io/v1alpha1/namespaces/default/pods/harness-probe/"
        "imagepullprogress", user="alice", check=False)
    assert "no-runtime.sock" in r.stdout + r.stderr, (r.stdout, r.stderr)
