"""The add-on installed with helm: what `helm install` gives, per the README."""

from __future__ import annotations

import json

from tests.framework.addon import Addon


def test_installed_addon_serves_through_the_charts_service(installed_addon: Addon) -> None:
    a = installed_addon
    code, body = a.cp.get(a.group_path())
    assert code == 200, body
    names = {r["name"] for r in json.loads(body)["resources"]}
    assert {"pods/imagepullprogress", "pods/copy", "nodes/imagepulls"} <= names
    api = a.get_json("apiservice", "v1alpha1.subresources.aggapi.io")
    assert api["spec"]["service"] == {"name": a.fullname, "namespace": a.namespace,
                                      "port": 443}
    assert api["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # Endpoints of the chart's Service come from the endpointslice controller, not the harness.
    slices = a.get_json("endpointslices", "-n", a.namespace,
                        f"-l=kubernetes.io/service-name={a.fullname}")["items"]
    assert slices and all(s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
                          == "endpointslice-controller.k8s.io" for s in slices)
    want = a.get_json("deployment", "-n", a.namespace, a.fullname)["spec"]["replicas"]
    servers = a.apiserver_pods()
    assert len(servers) == want and all(a.ready(p) for p in servers)
    # One replica per node while there are enough nodes (the chart's anti-affinity).
    assert len({p["spec"]["nodeName"] for p in servers}) == min(want, len(a.node_names()))
    agents = {p["spec"]["nodeName"] for p in a.pods("agent") if a.ready(p)}
    assert agents == set(a.node_names())
