"""The cluster's own controllers at work, with nothing standing in for them.

kube-controller-manager and kube-scheduler run once per session (tests.framework.controllers,
started by the ``control_plane`` fixture); a real kubelet runs for this module. Proven here:

- a Deployment gets its ReplicaSet from the deployment controller and its pods from the
  replicaset controller; kube-scheduler binds them to the node and kubelet runs them;
- the endpointslice controller lists those pods for a Service that selects them;
- a pod's ServiceAccount token is a real projected token: TokenReview authenticates it as
  the pod's ServiceAccount, bound to that pod;
- the clusterrole-aggregation controller puts aggapi's shipped rules into view/edit/admin,
  and follows a change of the labelled roles.

Not here: ClusterIP Services through kube-proxy (this node's containerd and kubelet run in
the host's network namespace; kube-proxy needs a namespace of the node's own): see
tests/e2e/test_two_nodes.py, on the two-node cluster of tests.framework.cluster.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.framework.controlplane import GROUP, ControlPlane
from tests.framework.kubelet import HARNESS_LABEL, Kubelet
from tests.framework.node import Node
from tests.framework.procs import wait_ready
from tests.framework.repo import REPO

pytestmark = pytest.mark.e2e

APP = "cluster-e2e"
NS = "default"
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
AGG = "rbac.authorization.k8s.io/aggregate-to-"


def get_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "-o", "json", *args).stdout)
    return out


def deployment(image: str) -> dict[str, Any]:
    labels = {"app": APP, HARNESS_LABEL: "pod"}  # the kubelet fixture's cleanup finds them
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NS},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": APP}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     # No nodeName: kube-scheduler places them. The token is mounted
                     # (automountServiceAccountToken defaults to true).
                     "terminationGracePeriodSeconds": 0, "dnsPolicy": "Default",
                     "containers": [{"name": "app", "image": image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["/bin/busybox", "sleep", "3600"]}]}}}}


@pytest.fixture(scope="module")
def deployed(control_plane: ControlPlane, kubelet: Kubelet,
             node: Node) -> Iterator[dict[str, Any]]:
    """The Deployment, rolled out (2 ready replicas); deleted with its ReplicaSet and pods
    by the garbage collector afterwards. Yields the Deployment as the controller left it."""
    cp = control_plane
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": APP, "namespace": NS},
           "spec": {"selector": {"app": APP},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
    t0 = time.monotonic()
    cp.apply([deployment(node.images.busybox), svc])
    try:
        r = cp.kubectl("rollout", "status", f"deployment/{APP}", "-n", NS, "--timeout=110s",
                       check=False)
        if r.returncode != 0:
            pods = cp.kubectl("describe", "pods", "-n", NS, "-l", f"app={APP}",
                              check=False).stdout
            pytest.fail(f"Deployment {APP} not rolled out: {r.stdout}{r.stderr}\n{pods}\n"
                        f"kubelet:\n{kubelet.tail(30)}")
        print(f"\ncluster: Deployment {APP} rolled out in {time.monotonic() - t0:.1f}s")
        yield get_json(cp, "deployment", APP, "-n", NS)
    finally:
        cp.kubectl("delete", "service", APP, "-n", NS, "--ignore-not-found", check=False)
        cp.kubectl("delete", "deployment", APP, "-n", NS, "--ignore-not-found",
                   "--cascade=foreground", "--timeout=120s", check=False)


def app_pods(cp: ControlPlane) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cp, "pods", "-n", NS, "-l", f"app={APP}")["items"]
    return items


def test_deployment_gets_replicaset_and_scheduled_running_pods(
        control_plane: ControlPlane, deployed: dict[str, Any], node: Node) -> None:
    cp = control_plane
    assert deployed["status"].get("readyReplicas") == 2, deployed["status"]
    rss = get_json(cp, "replicasets", "-n", NS, "-l", f"app={APP}")["items"]
    assert len(rss) == 1
    rs = rss[0]
    assert [o["uid"] for o in rs["metadata"]["ownerReferences"]] == [deployed["metadata"]["uid"]]
    pods = app_pods(cp)
    assert len(pods) == 2
    for p in pods:
        assert [o["uid"] for o in p["metadata"]["ownerReferences"]] == [rs["metadata"]["uid"]]
        assert p["spec"]["nodeName"] == node.name
        assert p["status"]["phase"] == "Running"
        assert p["status"]["containerStatuses"][0]["ready"] is True
        # Bound by kube-scheduler (the template has no nodeName), run by the real kubelet.
        evs = get_json(cp, "events", "-n", NS,
                       f"--field-selector=involvedObject.name={p['metadata']['name']}")["items"]
        scheduled = [e for e in evs if e["reason"] == "Scheduled"]
        assert scheduled and all(
            (e.get("reportingComponent") or e.get("source", {}).get("component"))
            == "default-scheduler" for e in scheduled), evs
        assert any(e["reason"] == "Started" and e["source"].get("host") == node.name
                   for e in evs), evs
    print(f"\ncluster: pods {[p['metadata']['name'] for p in pods]} on {node.name}")


def test_endpointslice_controller_lists_the_pods(control_plane: ControlPlane,
                                                deployed: dict[str, Any]) -> None:
    cp = control_plane
    want = sorted(p["status"]["podIP"] for p in app_pods(cp))

    def slices() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get_json(
            cp, "endpointslices", "-n", NS, f"-l=kubernetes.io/service-name={APP}")["items"]
        return items

    def listed() -> bool:
        return sorted(a for s in slices() for e in s.get("endpoints") or []
                      if (e.get("conditions") or {}).get("ready") for a in e["addresses"]) == want

    wait_ready(listed, 30, f"EndpointSlices of Service {APP} listing {want}")
    items = slices()
    assert items
    for s in items:
        assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == \
            "endpointslice-controller.k8s.io"
        assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


def test_pod_token_is_a_real_projected_token(control_plane: ControlPlane,
                                            deployed: dict[str, Any]) -> None:
    cp = control_plane
    pod = app_pods(cp)[0]
    name = pod["metadata"]["name"]
    vols = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert vols and "serviceAccountToken" in vols[0]["projected"]["sources"][0]
    token = cp.kubectl("exec", "-n", NS, name, "-c", "app", "--",
                       "/bin/busybox", "cat", SA_TOKEN).stdout.strip()
    assert token.count(".") == 2  # a JWT
    review = json.loads(cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token}})).stdout)
    st = review["status"]
    assert st.get("authenticated") is True, st
    assert st["user"]["username"] == f"system:serviceaccount:{NS}:default"
    assert f"system:serviceaccounts:{NS}" in st["user"]["groups"]
    # Bound to this pod: kubelet asked for it with the pod as the bound object.
    assert st["user"]["extra"]["authentication.kubernetes.io/pod-name"] == [name]
    assert st["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == \
        [pod["metadata"]["uid"]]
    # A token that was never issued is refused.
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    bad = json.loads(cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": forged}})).stdout)
    assert not bad["status"].get("authenticated")


# --- ClusterRole aggregation ------------------------------------------------------------------

def shipped_aggregated_roles() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((REPO / "manifests/base/rbac-aggregated.yaml").read_text())
    return [d for d in docs if d and d.get("kind") == "ClusterRole"]


def rules_of(cp: ControlPlane, role: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = get_json(cp, "clusterrole", role).get("rules") or []
    return rules


def has_rules(cp: ControlPlane, role: str, rules: list[dict[str, Any]]) -> bool:
    got = rules_of(cp, role)
    return all(r in got for r in rules)


def lacks_rule(cp: ControlPlane, role: str, rule: dict[str, Any]) -> bool:
    return rule not in rules_of(cp, role)


def test_builtin_roles_aggregate_aggapi_rules(control_plane: ControlPlane) -> None:
    cp = control_plane
    shipped = shipped_aggregated_roles()
    assert shipped, "manifests/base/rbac-aggregated.yaml has no ClusterRole"
    checked = 0
    for target in ("view", "edit", "admin"):
        mine = [r for role in shipped
                if role["metadata"]["labels"].get(AGG + target) == "true"
                for r in role["rules"]]
        if not mine:
            continue
        wait_ready(functools.partial(has_rules, cp, target, mine), 30,
                 f"aggapi's rules in ClusterRole {target}")
        checked += 1
    assert checked == 3
    # The rules take effect through the built-in role: a user bound only to "view" in one
    # namespace may watch image pull progress there (and nowhere else), not copy.
    user = f"cluster-viewer-{uuid.uuid4().hex[:6]}"
    cp.add_user(user)
    binding = f"{user}-view"
    cp.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": binding, "namespace": NS},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "view"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": user}]}])
    try:
        def can(verb: str, sub: str, ns: str = NS) -> bool:
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": {
                          "verb": verb, "group": GROUP, "resource": "pods",
                          "subresource": sub, "namespace": ns, "name": "x"}}}
            out = cp.kubectl("create", "--validate=false", "-o", "json", "-f", "-",
                             user=user, input=json.dumps(review))
            return bool(json.loads(out.stdout)["status"].get("allowed"))

        # The authorizer sees the new binding through its informer: a moment later.
        wait_ready(lambda: can("get", "imagepullprogress"), 10, "the RoleBinding in effect")
        for verb, sub, ns, want in (("watch", "imagepullprogress", NS, True),
                                    ("get", "imagepullprogress", "kube-system", False),
                                    ("create", "copy", NS, False)):
            assert can(verb, sub, ns) is want, (verb, sub, ns)
    finally:
        cp.kubectl("delete", "rolebinding", binding, "-n", NS, "--ignore-not-found",
                   check=False)


def test_aggregation_follows_labelled_roles(control_plane: ControlPlane) -> None:
    """A role labelled aggregate-to-edit joins edit and admin, not view; it leaves them
    when deleted: the controller keeps them in step, nothing copied them once."""
    cp = control_plane
    name = f"cluster-e2e-agg-{uuid.uuid4().hex[:6]}"
    rule = {"apiGroups": [GROUP], "resources": [f"{name}s"], "verbs": ["get"]}
    cp.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "labels": {AGG + "edit": "true",
                                                     AGG + "admin": "true"}},
               "rules": [rule]}])
    try:
        t0 = time.monotonic()
        for target in ("edit", "admin"):
            wait_ready(functools.partial(has_rules, cp, target, [rule]), 30,
                     f"{name}'s rule in {target}")
        print(f"\ncluster: aggregated into edit/admin in {time.monotonic() - t0:.1f}s")
        assert rule not in rules_of(cp, "view")
    finally:
        cp.kubectl("delete", "clusterrole", name, "--ignore-not-found", check=False)
    for target in ("edit", "admin"):
        wait_ready(functools.partial(lacks_rule, cp, target, rule), 30,
                 f"{name}'s rule gone from {target}")
