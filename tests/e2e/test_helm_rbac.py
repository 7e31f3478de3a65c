"""The chart's aggregated roles against the real kube-apiserver of the harness: a user bound
only through them gets exactly the documented access. ClusterRole aggregation is
kube-controller-manager's (it runs with the control plane)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.helmsupport import CHART, GROUP, _docs, _helm, _wait
from tests.framework.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

AGG = "rbac.authorization.k8s.io/aggregate-to-"


def _ssar(cp: ControlPlane, user: str, verb: str, resource: str, subresource: str = "",
          group: str = GROUP, namespace: str = "default", name: str = "x") -> bool:
    attrs = {"verb": verb, "group": group, "resource": resource, "name": name}
    if subresource:
        attrs["subresource"] = subresource
    if namespace:
        attrs["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attrs}}
    out = cp.kubectl("create", "--validate=false", "-o", "json", "-f", "-", user=user,
                     input=json.dumps(review))
    return bool(json.loads(out.stdout)["status"].get("allowed"))


def test_aggregated_roles_grant_exactly_the_documented_access(control_plane: ControlPlane) -> None:
    cp = control_plane
    release = "rbac-e2e"
    rendered = _docs(_helm(cp, "template", release, str(CHART), "-n", "aggapi-rbac",
                           "--show-only", "templates/rbac-aggregated.yaml").stdout)
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                    "items": rendered}))
    ours = {f"{release}-aggapi-view": "view", f"{release}-aggapi-edit": "edit"}
    # kube-controller-manager's clusterrole-aggregation controller copies our rules into
    # the built-in view, edit and admin (by the aggregate-to-* labels): nothing is
    # aggregated here, the users below are bound to the built-in roles themselves.
    rules_of: dict[str, list[Any]] = {"view": [], "edit": [], "admin": []}
    for d in rendered:
        for target in rules_of:
            if (d["metadata"].get("labels") or {}).get(AGG + target) == "true":
                rules_of[target] += d["rules"]
    # ...and the node collection's reader, aggregated to cluster readers (not to view).
    reader = f"{release}-aggapi-node-image-pulls-reader"
    assert set(ours) | {reader} == {d["metadata"]["name"] for d in rendered}
    assert not any((d["metadata"].get("labels") or {}).get(AGG + t) == "true"
                   for d in rendered if d["metadata"]["name"] == reader
                   for t in rules_of)
    assert all(rules_of.values())

    def aggregated() -> bool:
        for target, rules in rules_of.items():
            role = json.loads(cp.kubectl("get", "clusterrole", target, "-o", "json").stdout)
            if not all(r in (role.get("rules") or []) for r in rules):
                return False
        return True

    _wait(aggregated, 60, "view/edit/admin aggregated by kube-controller-manager")

    objs: list[dict[str, Any]] = []
    users = {"agg-viewer": "view", "agg-editor": "edit", "agg-admin": "admin"}
    for user, target in users.items():
        cp.add_user(user)
        objs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": f"e2e-aggregated-{user}"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": target},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                           "name": user}]},
        ]
    # view granted in one namespace only (the usual RoleBinding): no cluster-scoped access.
    cp.add_user("agg-ns-viewer")
    cp.add_user("agg-nobody")
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "e2e-aggregated-ns-viewer", "namespace": "default"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "view"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                               "name": "agg-ns-viewer"}]})
    cp.apply(objs)

    verbs = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
    progress = {"get", "watch"}
    copy = {"get", "create", "watch"}
    expect: dict[str, dict[str, set[str]]] = {
        "agg-viewer": {"imagepullprogress": progress, "copy": set(), "imagepulls": {"get"}},
        "agg-editor": {"imagepullprogress": progress, "copy": copy, "imagepulls": {"get"}},
        "agg-admin": {"imagepullprogress": progress, "copy": copy, "imagepulls": {"get"}},
        "agg-ns-viewer": {"imagepullprogress": progress, "copy": set(), "imagepulls": set()},
        "agg-nobody": {"imagepullprogress": set(), "copy": set(), "imagepulls": set()},
    }
    failures = []
    for user, want in expect.items():
        for verb in verbs:
            got = {
                "imagepullprogress": _ssar(cp, user, verb, "pods", "imagepullprogress"),
                "copy": _ssar(cp, user, verb, "pods", "copy"),
                "imagepulls": _ssar(cp, user, verb, "nodes", "imagepulls", namespace=""),
            }
            for sub, allowed in got.items():
                if allowed != (verb in want[sub]):
                    failures.append(f"{user} {verb} {sub}: allowed={allowed}")
        # Outside the RoleBinding's namespace the namespaced viewer has nothing.
        if user == "agg-ns-viewer":
            assert not _ssar(cp, user, "get", "pods", "imagepullprogress", namespace="kube-system")
    assert not failures, "\n".join(failures)
    # Every copy also needs create on core pods/exec: edit and admin have it, view not.
    assert _ssar(cp, "agg-editor", "create", "pods", "exec", group="")
    assert not _ssar(cp, "agg-viewer", "create", "pods", "exec", group="")
