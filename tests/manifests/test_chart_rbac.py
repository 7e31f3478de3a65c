"""The chart's RBAC: the apiserver's exactly as documented, the aggregated roles."""

from __future__ import annotations

from typing import Any

from tests.manifests.conftest import GROUP, Render, find

AGG = "rbac.authorization.k8s.io/aggregate-to-"


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def test_apiserver_rbac_is_exactly_the_documented_set(render: Render) -> None:
    docs = render()
    role = find(docs, "ClusterRole", "aggapi-apiserver")
    # podimagepulls/nodeimagepulls: a replica forwards them to the leader as itself.
    assert _rules(role) == {(g, r, v) for g, r in [
        ("", "pods"), ("", "events"), ("certificates.k8s.io", "certificatesigningrequests"),
        ("subresources.aggapi.io", "podimagepulls"),
        ("subresources.aggapi.io", "nodeimagepulls")]
        for v in ("get", "list", "watch")}
    # EndpointSlices (the agents'), ConfigMaps (its public token key) and the
    # collections' Lease only in its own namespace: a Role, not a ClusterRole.
    ns_role = find(docs, "Role", "aggapi-apiserver")
    assert ns_role["metadata"]["namespace"] == "aggapi"
    assert _rules(ns_role) == {("discovery.k8s.io", "endpointslices", v)
                               for v in ("get", "list", "watch")} | {
        ("", "configmaps", v) for v in ("get", "create", "update")} | {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    sa = {"kind": "ServiceAccount", "name": "aggapi-apiserver", "namespace": "aggapi"}
    crbs = {d["roleRef"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"
            and d["metadata"]["name"].startswith("aggapi-apiserver")}
    assert set(crbs) == {"aggapi-apiserver", "system:auth-delegator"}
    for b in crbs.values():
        assert b["subjects"] == [sa]
    rbs = {(d["metadata"]["namespace"], d["roleRef"]["name"]): d for d in docs
           if d["kind"] == "RoleBinding" and d["subjects"] == [sa]}
    assert set(rbs) == {("kube-system", "extension-apiserver-authentication-reader"),
                        ("aggapi", "aggapi-apiserver")}
    for (_ns, name), rb in rbs.items():
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": name}
    # No Role/ClusterRole besides ours; the agent is bound to system:auth-delegator
    # (its metrics port's TokenReviews and SubjectAccessReviews) and reads ConfigMaps in
    # its namespace (the published token keys).
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    assert roles == {("ClusterRole", "aggapi-apiserver"), ("Role", "aggapi-apiserver"),
                     ("Role", "aggapi-agent"), ("ClusterRole", "aggapi-agent"),
                     ("ClusterRole", "aggapi-view"), ("ClusterRole", "aggapi-edit"),
                     ("ClusterRole", "aggapi-node-image-pulls-reader")}
    assert _rules(find(docs, "Role", "aggapi-agent")) == {
        ("", "configmaps", v) for v in ("get", "list", "watch")}
    # Its per-node serving identity: create a CSR (agent.servingIdentity=ephemeral).
    assert _rules(find(docs, "ClusterRole", "aggapi-agent")) == {
        ("certificates.k8s.io", "certificatesigningrequests", "create")}
    agent_sa = find(docs, "ServiceAccount", "aggapi-agent")
    assert agent_sa["automountServiceAccountToken"] is False
    agent_sa_ref = {"kind": "ServiceAccount", "name": "aggapi-agent", "namespace": "aggapi"}
    agent_bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                      and agent_sa_ref in d["subjects"]]
    assert sorted((b["kind"], b["roleRef"]["name"]) for b in agent_bindings) == [
        ("ClusterRoleBinding", "aggapi-agent"), ("ClusterRoleBinding", "system:auth-delegator"),
        ("RoleBinding", "aggapi-agent")]
    # With a key file, nobody needs ConfigMaps.
    files = render(["tokenSigning.mode=existingSecret"])
    assert _rules(find(files, "Role", "aggapi-apiserver")) == {
        ("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")} | {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    assert not [d for d in files if d["metadata"]["name"] == "aggapi-agent"
                and d["kind"] in ("Role", "RoleBinding")]


def test_aggregated_roles(render: Render) -> None:
    docs = render()
    view = find(docs, "ClusterRole", "aggapi-view")
    edit = find(docs, "ClusterRole", "aggapi-edit")
    assert {k: v for k, v in view["metadata"]["labels"].items() if k.startswith(AGG)} == {
        AGG + "view": "true", AGG + "edit": "true", AGG + "admin": "true"}
    assert {k: v for k, v in edit["metadata"]["labels"].items() if k.startswith(AGG)} == {
        AGG + "edit": "true", AGG + "admin": "true"}
    assert _rules(view) == {(GROUP, "pods/imagepullprogress", "get"),
                            (GROUP, "pods/imagepullprogress", "watch"),
                            (GROUP, "nodes/imagepulls", "get")} | {
        (GROUP, "podimagepulls", v) for v in ("get", "list", "watch")}
    # nodeimagepulls names every namespace's images: cluster readers only, never view
    nodes = find(docs, "ClusterRole", "aggapi-node-image-pulls-reader")
    assert _rules(nodes) == {(GROUP, "nodeimagepulls", v) for v in ("get", "list", "watch")}
    assert {k for k in nodes["metadata"]["labels"] if k.startswith(AGG)} == {
        AGG + "cluster-reader"}
    assert _rules(edit) == {(GROUP, "pods/copy", v) for v in ("get", "create", "watch")}
    off = render(["rbac.aggregateToDefaultRoles=false"])
    assert not [d for d in off if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] not in ("aggapi-apiserver", "aggapi-agent")]
