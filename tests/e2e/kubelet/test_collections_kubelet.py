"""podimagepulls and nodeimagepulls through the real aggregator, real kubectl and a real
kubelet pulling (issue 25): list and watch with label and field selectors, the Table
columns kubectl prints, -o yaml, and RBAC by ServiceAccount (view lists and watches,
nobody gets 403)."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
import time
import urllib.request
from typing import Any

import yaml

from tests.e2e.kubelet.conftest import (
    GV,
    KImages,
    create_pods,
    delete_pods,
    forget_images,
    pod,
    wait_for,
    wait_running,
)
from tests.framework.controlplane import AGGAPI_PORT, ControlPlane, binary
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node
from tests.framework.openapicheck import check
from tests.framework.procs import stop_child

MiB = 1 << 20
VIEWER = "system:serviceaccount:default:aggapi-e2e-viewer"
NOBODY = "system:serviceaccount:default:aggapi-e2e-nobody"


class Lines:
    """A long-running kubectl, its stdout lines read in a thread."""

    def __init__(self, cp: ControlPlane, *args: str) -> None:
        self.proc = subprocess.Popen([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}",
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> str:
        stop_child(self.proc)
        self._thread.join(5)
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


def _rbac(cp: ControlPlane) -> None:
    # No kube-controller-manager aggregates roles here: bind the shipped aggapi-view
    # (which `view` aggregates on a real cluster) to the viewer directly.
    cp.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "aggapi-e2e-viewer", "namespace": "default"}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "aggapi-e2e-nobody", "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "aggapi-e2e-viewer", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "aggapi-view"},
         "subjects": [{"kind": "ServiceAccount", "name": "aggapi-e2e-viewer",
                       "namespace": "default"}]}])


def _aggapi_metric(cp: ControlPlane, name: str) -> float:
    """A gauge of the harness's aggapi apiserver, scraped as admin (client certificate)."""
    ctx = ssl.create_default_context(cafile=str(cp.aggapi_certs / "ca.crt"))
    ctx.check_hostname = False  # the serving certificate names the Service, not the IP
    ctx.load_cert_chain(cp.pki_dir / "admin.crt", cp.pki_dir / "admin.key")
    url = f"https://{cp.api_host.address}:{AGGAPI_PORT}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def _items(cp: ControlPlane, *args: str) -> list[dict[str, Any]]:
    out = json.loads(cp.kubectl("get", "podimagepulls", "-o", "json", *args).stdout)
    items: list[dict[str, Any]] = out["items"]
    return items


def _contract(cp: ControlPlane) -> None:
    """Issue 36 through kube-apiserver (its own authorization and aggregator first):
    client-go's WatchList ends its state with the annotated bookmark; a selector
    kube's grammar gives a field we lack is 400 (split on every comma it was
    authorized for kc-web and matched every pod); an invalid combination is 422."""
    ns = f"{GV}/namespaces/default/podimagepulls"
    listed = cp.kubectl("get", "--raw", f"{ns}?watch=true&sendInitialEvents=true&"
                        "resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&"
                        "timeoutSeconds=2")
    events = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    ends = [i for i, e in enumerate(events) if e["type"] == "BOOKMARK" and (
        e["object"]["metadata"].get("annotations") or {}).get(
            "k8s.io/initial-events-end") == "true"]
    assert ends and all(e["type"] == "ADDED" for e in events[:ends[0]]) and ends[0] > 0, \
        events
    bad = cp.kubectl("get", "--raw", f"{ns}?fieldSelector=metadata.namespace!%3D(,"
                     "metadata.name%3Dkc-web,a%3D)", check=False)
    assert bad.returncode == 1 and "field label not supported: a" in bad.stderr, bad.stderr
    invalid = cp.kubectl("get", "--raw", f"{ns}?resourceVersionMatch=Exact", check=False)
    assert invalid.returncode == 1 and "resourceVersionMatch is forbidden unless " \
        "resourceVersion is provided" in invalid.stderr, invalid.stderr


def test_collections_through_kubectl(control_plane: ControlPlane, node: Node,
                                     real_node: Kubelet, kimages: KImages) -> None:
    cp = control_plane
    delete_pods(cp, "kc-web", "kc-other")
    forget_images(node, kimages.kep_a, kimages.app_a)
    _rbac(cp)
    web_image = node.via_throttle(kimages.kep_a)
    node.set_rate(3 * MiB)  # 40 MiB: ~13 s of Downloading to watch
    watch = Lines(cp, "get", "podimagepulls", "-l", "app=kc-web", "-w")
    try:
        create_pods(cp, [
            pod(node, "kc-web", [{"name": "c", "image": web_image}], labels={"app": "kc-web"}),
            pod(node, "kc-other", [{"name": "c", "image": node.via_throttle(kimages.app_a)}],
                labels={"app": "kc-other"})])
        # -o yaml: the full object, labels copied from the pod
        def downloading() -> dict[str, Any] | None:
            out = yaml.safe_load(cp.kubectl("get", "podimagepulls", "-l", "app=kc-web",
                                            "-o", "yaml").stdout)
            items = out["items"]
            return items[0] if items and items[0]["status"]["images"][0]["phase"] \
                == "Downloading" else None
        obj = wait_for(downloading, 60, "kc-web Downloading in podimagepulls")
        assert obj["kind"] == "PodImagePull" and obj["metadata"]["labels"]["app"] == "kc-web"
        assert obj["spec"]["nodeName"] == node.name
        image = obj["status"]["images"][0]
        assert image["image"] == web_image and image["total"] > 40 * MiB
        assert 0 <= image["progress"] <= image["total"]
        # field selectors, as kube-apiserver passes them through
        names = {i["metadata"]["name"] for i in _items(
            cp, f"--field-selector=spec.nodeName={node.name}")}
        assert {"kc-web", "kc-other"} <= names
        assert [i["metadata"]["name"] for i in _items(
            cp, "--field-selector=metadata.name=kc-other")] == ["kc-other"]
        bad = cp.kubectl("get", "podimagepulls", "--field-selector=status.phase=x",
                         check=False)
        assert bad.returncode == 1 and "field label not supported" in bad.stderr, bad.stderr
        # What following these pods costs on kube-apiserver: the namespace's pod and
        # event watch (the -w, the lists and the selectors all share them).
        watches = _aggapi_metric(cp, "aggapi_apiserver_collection_watches")
        print(f"collections: {watches:.0f} watches on kube-apiserver, "
              f"{_aggapi_metric(cp, 'aggapi_apiserver_collection_node_polls'):.0f} node polls")
        assert watches == 2
        # kubectl explain reads the OpenAPI schema the aggregator merged in
        explain = cp.kubectl("explain", "podimagepulls.status.images").stdout
        assert "waitingForSlot" in explain and "etaSeconds" in explain, explain
        # metadata is ObjectMeta (a bare object at 95095d5: explain listed no fields)
        meta = cp.kubectl("explain", "podimagepulls.metadata").stdout
        assert all(f in meta for f in ("creationTimestamp", "labels", "uid",
                                       "resourceVersion")), meta
        # nodeimagepulls: the node's table, columns from the server, AGE as for nodes
        nodes = cp.kubectl("get", "nodeimagepulls").stdout.splitlines()
        assert nodes[0].split() == ["NAME", "PULLING", "SLOTS", "WAITING", "PODS",
                                    "AGE"], nodes
        assert any(line.split()[0] == node.name for line in nodes[1:]), nodes
        _node_imagepulls(cp, node.name)
        # RBAC: a ServiceAccount bound to view lists and watches, one without gets 403
        ok = cp.kubectl("get", "podimagepulls", f"--as={VIEWER}")
        assert "kc-web" in ok.stdout
        watched = cp.kubectl("get", "--raw", f"{GV}/namespaces/default/podimagepulls?"
                             "watch=true&timeoutSeconds=2", f"--as={VIEWER}")
        assert any(json.loads(line)["type"] == "ADDED" for line in watched.stdout.splitlines())
        _contract(cp)
        for args in (["podimagepulls"], ["podimagepulls", "-w", "--request-timeout=5s"],
                     ["nodeimagepulls"]):
            denied = cp.kubectl("get", *args, f"--as={NOBODY}", check=False)
            assert denied.returncode == 1 and "Forbidden" in denied.stderr, denied.stderr
        cluster = cp.kubectl("get", "nodeimagepulls", f"--as={VIEWER}", check=False)
        assert cluster.returncode == 1 and "Forbidden" in cluster.stderr  # view is not enough
        wait_running(cp, "kc-web", timeout=120)
        wait_for(lambda: any(" Done " in f" {line} " for line in watch.lines), 30,
                 "the watch printing Done")
        # the bytes the pull brought stay after Done (null at 95095d5)
        done = json.loads(cp.kubectl("get", "podimagepulls", "kc-web", "-o", "json").stdout)
        [image] = done["status"]["images"]
        assert image["phase"] == "Done" and image["total"] > 40 * MiB, image
        assert image["progress"] == image["total"] == done["status"]["total"], done["status"]
    finally:
        err = watch.stop()
        node.set_rate(None)
        delete_pods(cp, "kc-web", "kc-other")
    # kubectl get -w: the server's columns, one row per change, Downloading then Done
    assert watch.lines and watch.lines[0].split() == [
        "NAME", "NODE", "IMAGES", "PHASE", "PROGRESS", "RATE", "ETA", "AGE"], (watch.lines, err)
    rows = [line.split() for line in watch.lines[1:] if line.strip()]
    assert all(r[0] == "kc-web" and r[1] == node.name for r in rows), rows
    phases = [r[3] for r in rows]
    assert "Downloading" in phases and phases[-1] == "Done", rows
    down = [r for r in rows if r[3] == "Downloading"]
    assert any(r[4].endswith("%") and r[5].endswith("/s") for r in down), down
    assert rows[-1][2] == "1/1" and rows[-1][4] == "100%"
    assert re.fullmatch(r"\d+s|\d+m\d*s?", rows[-1][7]), rows[-1]


def _node_imagepulls(cp: ControlPlane, node: str) -> None:
    """nodes/NODE/imagepulls is a Kubernetes object that the OpenAPI document kubectl
    reads describes key for key; an unknown node is a 404 at once (a 503 with
    Retry-After at 95095d5, which kubectl retried)."""
    doc = json.loads(cp.kubectl("get", "--raw",
                                "/openapi/v3/apis/subresources.aggapi.io/v1alpha1").stdout)
    body = json.loads(cp.kubectl("get", "--raw", f"{GV}/nodes/{node}/imagepulls").stdout)
    assert (body["kind"], body["metadata"]["name"]) == ("NodeImagePulls", node), body
    check(body, "io.aggapi.subresources.v1alpha1.NodeImagePulls", doc["components"]["schemas"])
    began = time.monotonic()
    gone = cp.kubectl("get", "--raw", f"{GV}/nodes/no-such-node/imagepulls",
                      "--request-timeout=20s", check=False)
    assert gone.returncode == 1 and "(NotFound)" in gone.stderr, gone.stderr
    assert 'nodes "no-such-node" not found' in gone.stderr, gone.stderr
    assert time.monotonic() - began < 10  # no retries
