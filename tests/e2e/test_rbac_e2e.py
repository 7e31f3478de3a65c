"""Who may do what, decided by kube-apiserver's RBAC before aggapi sees the request (and
by aggapi's own SubjectAccessReviews for the operation verb and pods/exec); the
APIService and discovery as kubectl sees them.

Users (hack/local/rbac.yaml; no kube-controller-manager runs, so the shipped aggregated
roles are bound directly): alice = aggapi-view + aggapi-edit + pods/exec ("edit"),
victor = aggapi-view only ("view"), mallory = no binding; plus no credentials at all.
rita (impersonated by admin) holds a read-everything role made by her test.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.framework.controlplane import APISERVICE, ControlPlane
from tests.framework.procs import Proc

from .conftest import GROUP_VERSION, E2EPod, kubectl, kubectl_stream

FORBIDDEN = "Error from server (Forbidden)"


async def test_view_user_streams_progress_but_cannot_copy(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path) -> None:
    for watch in (False, True):
        stream = await kubectl_stream(control_plane, workload_pod.path("imagepullprogress",
                                                                       watch=watch),
                                      user="victor", timeout=30)
        assert stream.rc == 0, stream.err
        assert stream.objects[-1]["kind"] == "Summary", stream.objects[-1]
    q = {"container": workload_pod.container, "path": "/etc/passwd"}
    r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", q),
                      user="victor")
    assert r.rc == 1 and FORBIDDEN in r.err, r.err
    assert 'User "victor" cannot get resource "pods/copy" in API group ' \
           '"subresources.aggapi.io"' in r.err
    src = tmp_path / "x"
    src.write_bytes(b"x")
    for watch, verb in ((False, "create"), (True, "watch")):
        r = await kubectl(control_plane, "create", "--raw",
                          workload_pod.path("copy", watch=watch, container="app",
                                            path="/tmp/victor"), "-f", str(src), user="victor")
        assert r.rc == 1 and FORBIDDEN in r.err, r.err
        assert f'User "victor" cannot {verb} resource "pods/copy"' in r.err, r.err


async def test_edit_user_copies_on_both_paths(control_plane: ControlPlane,
                                              workload_pod: E2EPod, tmp_path: Path) -> None:
    src = tmp_path / "x"
    src.write_bytes(b"from alice\n")
    for watch in (False, True):
        q = {"container": "app", "path": f"/tmp/alice-{int(watch)}"}
        r = await kubectl(control_plane, "create", "--raw",
                          workload_pod.path("copy", q, watch=watch), "-f", str(src))
        assert r.rc == 0, r.err
        r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", q))
        assert r.out == src.read_bytes()


async def test_no_binding_is_403(control_plane: ControlPlane, workload_pod: E2EPod) -> None:
    for path, verb, sub in (
            (workload_pod.path("imagepullprogress"), "get", "imagepullprogress"),
            (workload_pod.path("imagepullprogress", watch=True), "watch", "imagepullprogress"),
            (workload_pod.path("copy", container="app", path="/etc/passwd"), "get", "copy")):
        r = await kubectl(control_plane, "get", "--raw", path, user="mallory")
        assert r.rc == 1 and FORBIDDEN in r.err, r.err
        assert f'User "mallory" cannot {verb} resource "pods/{sub}"' in r.err, r.err


async def test_unauthenticated_is_401(control_plane: ControlPlane, workload_pod: E2EPod,
                                      anonymous_kubeconfig: Path) -> None:
    """kubectl with a kubeconfig holding no credentials would prompt for a username (and
    fail on EOF): give it a token nobody issued. And a plain HTTPS request without any
    credentials. Both are 401 from kube-apiserver; aggapi is never reached."""
    for path in (workload_pod.path("imagepullprogress"),
                 workload_pod.path("copy", container="app", path="/etc/passwd")):
        r = await kubectl(control_plane, "--token=not-a-token", "get", "--raw", path,
                          user=None, kubeconfig=anonymous_kubeconfig)
        assert r.rc == 1 and "Unauthorized" in r.err, r.err
        assert not r.out
        code, body = await asyncio.to_thread(control_plane.get, path, authenticated=False)
        assert code == 401, body
        assert json.loads(body)["reason"] == "Unauthorized"


async def test_apiservice_available_and_discovery(control_plane: ControlPlane,
                                                  aggapi_apiserver: Proc) -> None:
    r = await kubectl(control_plane, "get", "apiservice", APISERVICE, "-o", "json", user=None)
    assert r.rc == 0, r.err
    conds = {c["type"]: c for c in json.loads(r.out)["status"]["conditions"]}
    assert conds["Available"]["status"] == "True", conds

    r = await kubectl(control_plane, "api-versions", user=None)
    assert "subresources.aggapi.io/v1alpha1" in r.out.decode().split()

    # kubectl api-resources skips subresources (names with a "/"), and our group has
    # only subresources: it lists nothing for it. Discovery itself is what to check.
    r = await kubectl(control_plane, "api-resources", "--api-group=subresources.aggapi.io",
                      "-o", "name", user=None)
    assert r.rc == 0, r.err
    assert "imagepullprogress" not in r.out.decode() and "copy" not in r.out.decode()

    r = await kubectl(control_plane, "get", "--raw", GROUP_VERSION, user="mallory")
    assert r.rc == 0, r.err  # discovery is open to every authenticated user
    disc = json.loads(r.out)
    assert disc["kind"] == "APIResourceList"
    assert disc["groupVersion"] == "subresources.aggapi.io/v1alpha1"
    res = {x["name"]: x for x in disc["resources"]}
    assert {"pods/imagepullprogress", "pods/copy"} <= set(res)
    assert "pods" not in res
    assert all(x["kind"] and x["namespaced"] for n, x in res.items() if n.startswith("pods/"))
    assert "get" in res["pods/imagepullprogress"]["verbs"]
    assert {"get", "create"} <= set(res["pods/copy"]["verbs"])


READER = "rita"
READER_GROUP = "aggapi-e2e-read-everything"
READ_EVERYTHING: list[dict[str, Any]] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": READER_GROUP},
     "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": READER_GROUP},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": READER_GROUP},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                   "name": READER_GROUP}]}]
# What `kubectl exec` needs (the ClusterRole of hack/local/rbac.yaml), granted later.
READER_EXEC: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": f"{READER_GROUP}-exec", "namespace": "default"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "aggapi-e2e-pods-exec"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                  "name": READER_GROUP}]}


def _head_as_reader(cp: ControlPlane, path: str) -> tuple[int, dict[str, str]]:
    """HEAD (stat) as rita, impersonated by admin: kubectl cannot send a HEAD."""
    req = urllib.request.Request(cp.server + path, method="HEAD", headers={
        "Impersonate-User": READER, "Impersonate-Group": READER_GROUP})
    try:
        with urllib.request.urlopen(req, context=cp._ssl("admin"), timeout=10) as r:
            return int(r.status), dict(r.headers)
    except urllib.error.HTTPError as e:
        return int(e.code), dict(e.headers)


async def test_read_everything_role_cannot_read_files(control_plane: ControlPlane,
                                                      workload_pod: E2EPod) -> None:
    """Issue 24 finding 1: get/list/watch on every resource of every group is not enough
    to read a container's files (its Secrets, its projected ServiceAccount token):
    downloads and stat need create on pods/exec, as kubectl exec does."""
    as_reader = (f"--as={READER}", f"--as-group={READER_GROUP}")
    path = workload_pod.path("copy", container=workload_pod.container, path="/etc/passwd")
    await asyncio.to_thread(control_plane.apply, READ_EVERYTHING)
    try:
        r = await kubectl(control_plane, *as_reader, "get", "--raw", path, user=None)
        assert r.rc == 1 and FORBIDDEN in r.err, r.err
        assert f'User "{READER}" cannot create resource "pods/exec" in API group ""' \
            in r.err, r.err
        assert not r.out
        code, headers = await asyncio.to_thread(_head_as_reader, control_plane, path)
        assert code == 403 and "X-Aggapi-Stat" not in headers, (code, headers)

        # With create pods/exec the same subject reads (once aggapi's cached denial of
        # at most --authz-deny-ttl, 10 s, has expired).
        await asyncio.to_thread(control_plane.apply, [READER_EXEC])
        deadline = time.monotonic() + 30
        while True:
            r = await kubectl(control_plane, *as_reader, "get", "--raw", path, user=None)
            if r.rc == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        assert r.rc == 0 and b"root:" in r.out, r.err
        code, headers = await asyncio.to_thread(_head_as_reader, control_plane, path)
        assert code == 200 and "X-Aggapi-Stat" in headers, (code, headers)
    finally:
        await asyncio.to_thread(control_plane.kubectl, "delete", "--ignore-not-found",
                                "rolebinding", "-n", "default", f"{READER_GROUP}-exec")
        await asyncio.to_thread(control_plane.kubectl, "delete", "--ignore-not-found",
                                "clusterrolebinding,clusterrole", READER_GROUP)
