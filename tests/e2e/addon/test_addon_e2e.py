"""The installed add-on (helm, pods on two nodes) serving what users call.

- a pull on node 2 is reported by node 2's agent: the pod's /watch/ progress stream shows
  its bytes, and the node view of node 2 (answered by the agent running there, which
  names its node) lists the pull while node 1's does not;
- copies into and out of pods on both nodes, sha256 checked;
- users bound only to the built-in view/edit ClusterRoles (which kube-controller-manager
  aggregated the chart's rules into) get exactly the documented access.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.addon.helpers import (
    MiB,
    RawStream,
    delete_pods,
    download,
    exec_in,
    kubectl_argv,
    path,
    run_pod,
    sha256,
    until,
)
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.controlplane import GROUP, VERSION
from tests.framework.kubelet import forget_images

pytestmark = pytest.mark.e2e


def test_pull_on_node_2_is_reported_by_node_2s_agent(installed_addon: Addon,
                                                      two_node_cluster: Cluster) -> None:
    a, reg = installed_addon, two_node_cluster.registry
    cp = a.cp
    n1, n2 = (n.name for n in two_node_cluster.nodes)
    repo_tag = reg.tag(reg.images.big, "addon-node2")
    image = reg.via_throttle(repo_tag)
    asyncio.run(forget_images(two_node_cluster.node(2).cri_address, repo_tag))
    reg.set_rate(10 * MiB)  # ~150 MB: about 15 s
    stream = RawStream(cp, path("imagepullprogress", "addon-pull", watch=True,
                                granularity="layer"))
    try:
        run_pod(cp, "addon-pull", n2, image, command=(), pull_policy="IfNotPresent",
                wait=False)
        stream.start()

        def node_view(node: str) -> dict[str, object]:
            code, body = cp.get(f"/apis/{GROUP}/{VERSION}/nodes/{node}/imagepulls")
            assert code == 200, body
            out: dict[str, object] = json.loads(body)
            return out

        def ours(view: dict[str, object]) -> list[dict[str, object]]:
            pulls = view.get("pulls") or []
            assert isinstance(pulls, list)
            return [p for p in pulls if any(repo_tag in str(i) for i in p.get("images") or [])]

        seen = until(lambda: (v := node_view(n2)) and ours(v) and v, 60,
                     f"the pull in {n2}'s node view")
        assert seen["node"] == n2
        # The kubelet config the agent read through /proc/1/root of node 2.
        assert isinstance(seen["kubelet"], dict)
        other = node_view(n1)
        assert other["node"] == n1 and not ours(other)
        assert stream.wait_end(120), "progress stream still open after the pull"
    finally:
        reg.set_rate(None)
        stream.stop()
    objs = [o for _, o in stream.objects]
    kinds = [o.get("kind") for o in objs]
    assert kinds and kinds[-1] == "Summary", kinds[-5:]
    moved = [int(o.get("progress") or 0) for o in objs if o.get("phase") == "Downloading"]
    assert moved and max(moved) > 10 * MiB, moved[-5:]
    span = stream.objects[-1][0] - stream.objects[0][0]
    print(f"\npull on {n2}: {len(objs)} objects over {span:.1f}s, max layer progress "
          f"{max(moved) / MiB:.0f} MiB; node view of {n2} named itself")
    pod = a.get_json("pod", "addon-pull")
    assert pod["spec"]["nodeName"] == n2
    delete_pods(cp, "addon-pull")


def test_copies_into_and_out_of_pods_on_both_nodes(installed_addon: Addon,
                                                    two_node_cluster: Cluster,
                                                    tmp_path: Path) -> None:
    cp = installed_addon.cp
    names = [f"addon-cp-{n.k}" for n in two_node_cluster.nodes]
    for n, name in zip(two_node_cluster.nodes, names, strict=True):
        run_pod(cp, name, n.name, wait=False)
    for name in names:
        cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
    try:
        for n, name in zip(two_node_cluster.nodes, names, strict=True):
            data = os.urandom(3 * MiB + n.k)
            src = tmp_path / f"up-{n.k}"
            src.write_bytes(data)
            up = path("copy", name, container="c", path="/tmp/uploaded.bin")
            r = cp.kubectl("create", "--raw", up, "-f", str(src))
            assert json.loads(r.stdout)["sha256"] == sha256(data)
            # In: the container itself sees the bytes.
            assert exec_in(cp, name, "sha256sum", "/tmp/uploaded.bin").split()[0] == sha256(data)
            # Out: a file the container wrote.
            exec_in(cp, name, "sh", "-c", f"head -c 2000000 /dev/urandom > /tmp/made-{n.k}")
            inside = exec_in(cp, name, "sha256sum", f"/tmp/made-{n.k}").split()[0]
            got = download(cp, path("copy", name, container="c", path=f"/tmp/made-{n.k}"),
                           tmp_path / f"down-{n.k}")
            assert got == inside
            print(f"\ncopy on {n.name}: 1 file in, 1 file out, sha256 match")
    finally:
        delete_pods(cp, *names)


def test_users_get_access_only_through_the_aggregated_roles(installed_addon: Addon,
                                                             two_node_cluster: Cluster,
                                                             tmp_path: Path) -> None:
    cp = installed_addon.cp
    node = two_node_cluster.nodes[0].name
    run_pod(cp, "addon-rbac", node)
    users = {"addon-viewer": "view", "addon-editor": "edit", "addon-admin": "admin"}
    objs = []
    for user, role in users.items():
        cp.add_user(user)
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{user}", "namespace": "default"},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                 "kind": "ClusterRole", "name": role},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                   "name": user}]})
    cp.add_user("addon-nobody")
    cp.apply(objs)
    src = tmp_path / "f"
    src.write_bytes(b"rbac\n")
    progress = path("imagepullprogress", "addon-rbac")
    copy = path("copy", "addon-rbac", container="c", path="/tmp/rbac")

    def allowed(user: str, *args: str) -> bool:
        r = subprocess.run(kubectl_argv(cp, user, *args), capture_output=True, text=True,
                           timeout=60)
        if r.returncode == 0:
            return True
        assert "Forbidden" in r.stderr or "forbidden" in r.stderr, r.stderr
        return False

    want = {  # user: (progress get, copy upload, copy download)
        "addon-viewer": (True, False, False),
        "addon-editor": (True, True, True),
        "addon-admin": (True, True, True),
        "addon-nobody": (False, False, False),
    }
    got = {}
    try:
        # The SAR cache of the apiservers may hold an earlier answer for a moment.
        deadline = time.monotonic() + 30
        while True:
            got = {u: (allowed(u, "get", "--raw", progress),
                       allowed(u, "create", "--raw", copy, "-f", str(src)),
                       allowed(u, "get", "--raw", copy)) for u in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert got == want
        # The node view is cluster-scoped: a RoleBinding to view does not reach it.
        assert not allowed("addon-viewer", "get", "--raw",
                           f"/apis/{GROUP}/{VERSION}/nodes/{node}/imagepulls")
    finally:
        delete_pods(cp, "addon-rbac")
        cp.kubectl("delete", "rolebinding", "-n", "default", *users, "--ignore-not-found")
