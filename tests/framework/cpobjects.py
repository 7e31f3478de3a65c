"""The objects the harness bootstraps: Namespace, Node, aggapi's Services, EndpointSlices
and APIService, the shipped RBAC."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from tests.framework.controllers import KCM
from tests.framework.cpaccess import AdminAccess
from tests.framework.cplayout import (
    AGENT_PORT,
    AGENT_SERVICE,
    AGGAPI_PORT,
    APISERVER_SERVICE,
    APISERVICE,
    GROUP,
    NAMESPACE,
    VERSION,
)
from tests.framework.kubetools import has
from tests.framework.procs import HarnessError
from tests.framework.repo import REPO


class Bootstrap(AdminAccess):
    def objects(self) -> list[dict[str, Any]]:
        ca_bundle = base64.b64encode((self.aggapi_certs / "ca.crt").read_bytes()).decode()
        labels = {"app.kubernetes.io/part-of": "aggapi"}

        def svc_and_slice(name: str, port: int, target: int, address: str,
                          node: str | None) -> list[dict[str, Any]]:
            ep: dict[str, Any] = {"addresses": [address], "conditions": {"ready": True}}
            if node:
                ep["nodeName"] = node
            return [
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                 # No selector: aggapi runs as host processes in network namespaces,
                 # outside any pod, so these EndpointSlices are the harness's (the
                 # pattern for out-of-cluster backends), not an endpointslice
                 # controller's stand-in. The agent Service is headless, as shipped.
                 "spec": {**({"clusterIP": "None"} if node else {}),
                          "ports": [{"name": "https", "port": port, "targetPort": target,
                                     "protocol": "TCP"}]}},
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": f"{name}-local", "namespace": NAMESPACE, "labels": {
                     **labels, "kubernetes.io/service-name": name,
                     "endpointslice.kubernetes.io/managed-by": "aggapi-harness"}},
                 "addressType": "IPv4", "endpoints": [ep],
                 "ports": [{"name": "https", "port": target, "protocol": "TCP"}]},
                # kube-aggregator before 1.33 resolves a Service through its Endpoints,
                # not its slices (--enable-aggregator-routing): no controller mirrors
                # slices into Endpoints, so the harness writes those too, marked
                # skip-mirror so the mirroring controller adds no second slice.
                *([] if has("aggregator-endpointslices") else [
                    {"apiVersion": "v1", "kind": "Endpoints",
                     "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
                         **labels, "endpointslice.kubernetes.io/skip-mirror": "true"}},
                     "subsets": [{"addresses": [{"ip": address, **(
                         {"nodeName": node} if node else {})}],
                         "ports": [{"name": "https", "port": target, "protocol": "TCP"}]}]}]),
            ]

        return [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": self.node_name, "labels": {
                 "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux"}}},
            *svc_and_slice(APISERVER_SERVICE, 443, AGGAPI_PORT, self.api_host.address, None),
            *svc_and_slice(AGENT_SERVICE, AGENT_PORT, AGENT_PORT, self.node_host.address,
                           self.node_name),
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": APISERVICE, "labels": labels},
             "spec": {"group": GROUP, "version": VERSION,
                      "service": {"namespace": NAMESPACE, "name": APISERVER_SERVICE,
                                  "port": 443},
                      "caBundle": ca_bundle, "groupPriorityMinimum": 1000,
                      "versionPriority": 15}},
        ]

    def node_status(self) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"status": {
            "addresses": [{"type": "InternalIP", "address": self.node_host.address},
                          {"type": "Hostname", "address": self.node_name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "AggapiHarness",
                            "message": "node served by the local aggapi agent",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": AGENT_PORT}},
        }}

    def rbac_files(self) -> list[Path]:
        """The shipped ServiceAccounts and RBAC, then the e2e users' bindings."""
        shipped = [REPO / "manifests/base" / f for f in
                   ("serviceaccounts.yaml", "rbac-apiserver.yaml", "rbac-aggregated.yaml")]
        missing = [str(f) for f in shipped if not f.exists()]
        if missing:
            raise HarnessError(f"shipped manifests missing: {missing}")
        return [*shipped, REPO / "hack/local/rbac.yaml"]

    def bootstrap(self) -> None:
        self.apply(self.objects())
        self.kubectl("apply", *(a for f in self.rbac_files() for a in ("-f", str(f))))
        self.kubectl("patch", "node", self.node_name, "--subresource=status", "--type=merge",
                     "-p", json.dumps(self.node_status()))
        # The serviceaccount controller creates them; pods are refused until it has.
        for ns in ("default", NAMESPACE):
            self._wait(lambda ns=ns: self.get(
                f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200, 60,
                f"ServiceAccount {ns}/default (kube-controller-manager)",
                self.proc(KCM))
