"""A cluster at scale on one host: real etcd, kube-apiserver, controllers and kubectl;
kwok's simulated Nodes; hollow agents; and the real aggapi apiserver under test.

On top of :class:`tests.framework.controlplane.ControlPlane` (instance ``e2e`` or
``local``):

- kwok (``hack/build-binaries.sh kwok``), a host process started and stopped by PID,
  manages the Nodes labelled ``HOLLOW_LABEL``: it makes them Ready and renews their
  Leases, and moves their pods through their lifecycle by the stages in
  :data:`STAGES` (Pending with its conditions once bound; Running once the hollow
  kubelet annotated the image as pulled; gone once deleted).
- One hollow process (``tests.framework.hollow``) in the node's network namespace runs
  an aggapi agent per Node over a simulated runtime, each on its own port of the
  node's address, published by an EndpointSlice naming the Node; it also posts
  kubelet's pull Events.
- Pods are created bound to a Node (``spec.nodeName``), as a scheduler would leave
  them, each with its own 3-layer image, so every pod has a pull of its own.

Everything is stopped by ``ControlPlane.down`` (every PID recorded in its state dir).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.kube.client import KubeError, load_client
from tests.framework.controlplane import (
    AGGAPI_PORT,
    GROUP,
    NAMESPACE,
    VERSION,
    ControlPlane,
    binary,
)
from tests.framework.hollow import DONE_LOG
from tests.framework.procs import HarnessError, Proc, spawn, stop_child, wait_ready
from tests.framework.repo import python_env

HOLLOW_LABEL = "aggapi.io/hollow"
ROLLOUT_LABEL = "scale.aggapi.io/rollout"
IMAGE_HOST = "registry.scale.test"
CREATORS = 16  # pods created concurrently

# kwok's stages (kwok.x-k8s.io/v1alpha1 Stage; selectors are jq expressions). Node:
# Ready once. Pod: bound -> Pending with its conditions and a waiting container; the
# hollow kubelet's annotation -> Running with the image's digest; deleted -> gone.
STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      addresses:
      - {type: InternalIP, address: "@ADDRESS@"}
      - {type: Hostname, address: {{ .metadata.name | Quote }}}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      allocatable: {cpu: "1k", memory: "1Ti", pods: "1M"}
      capacity: {cpu: "1k", memory: "1Ti", pods: "1M"}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-pending
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.hostIP', operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Pending
      hostIP: "@ADDRESS@"
      startTime: {{ $now | Quote }}
      conditions:
      - {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "False", reason: ContainersNotReady,
         lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: false
        restartCount: 0
        state: {waiting: {reason: ContainerCreating}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.status.hostIP', operator: Exists}
    - {key: '.metadata.annotations["@PULLED@"]', operator: Exists}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $digest := index .metadata.annotations "@PULLED@" }}
      phase: Running
      conditions:
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: {{ $digest | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: hollow-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
"""


def image_of(index: int) -> str:
    """Pod ``index``'s image: one repository per pod, so each has a pull of its own."""
    return f"{IMAGE_HOST}/rollout/app-{index}:v1"


@dataclass
class ScaleCluster:
    cp: ControlPlane
    nodes: int
    slots: int = 2
    seed: int = 1
    fail_fraction: float = 0.02
    back_off: float = 2.0
    # Layers download this many times slower: a rollout that outlasts creating its
    # pods (10,000 take a minute to create), so that updates reach a running watch.
    slowdown: float = 1.0
    base_port: int = 20000
    namespaces: int = 4
    created: int = 0
    watches_before_aggapi: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        return [f"hollow-{i}" for i in range(self.nodes)]

    def namespace(self, index: int) -> str:
        return f"scale-{index % self.namespaces}"

    @property
    def hollow_dir(self) -> Path:
        return self.cp.state / "hollow"

    # --- lifecycle -------------------------------------------------------------------
    def up(self) -> dict[str, float]:
        def step(name: str, fn: Any) -> None:
            t0 = time.monotonic()
            fn()
            self.timings[name] = round(time.monotonic() - t0, 2)

        step("control_plane_s", self.cp.up)
        step("kwok_nodes_ready_s", self.start_nodes)
        step("hollow_agents_s", self.start_hollow)
        self.watches_before_aggapi = self.kube_watches()
        step("aggapi_available_s", lambda: self.cp.start_apiserver(wait=90))
        return self.timings

    def down(self, *, keep_state: bool = False) -> None:
        """Everything, control plane included (the bench's own harness); its logs stay
        with ``keep_state`` (the next ``down`` removes them)."""
        self.cp.down(keep_state=keep_state)

    def start(self) -> None:
        """kwok's Nodes and the hollow agents on a control plane that is up already."""
        self.start_nodes()
        self.start_hollow()

    def stop(self) -> None:
        """Undo :meth:`start` on a shared control plane: the pods go first (kwok's
        delete stage finishes them), then kwok and the hollow process by PID, then
        their Nodes and EndpointSlices."""
        # Removed outright first (no grace period, one request): deleted with their
        # namespaces, each waits for the namespace controller and then kwok's stage, which
        # took 40 s for 100 pods in the fresh-clone CI.
        self.cp.kubectl("delete", "pods", "--all-namespaces", "-l", f"{ROLLOUT_LABEL}=1",
                        "--grace-period=0", "--force", "--wait=false", "--ignore-not-found",
                        check=False)
        for i in range(self.namespaces):
            self.cp.kubectl("delete", "namespace", self.namespace(i), "--wait=false",
                            "--ignore-not-found", check=False)
        with contextlib.suppress(HarnessError):
            wait_ready(lambda: not self._any_pod(), 60, "the rollout's pods deleted")
        self.hollow.stop()
        self.cp.proc("kwok").stop()
        self.cp.kubectl("delete", "nodes", "-l", f"{HOLLOW_LABEL}=true", "--wait=false",
                        "--ignore-not-found", check=False)
        self.cp.kubectl("-n", NAMESPACE, "delete", "endpointslices", "-l",
                        "endpointslice.kubernetes.io/managed-by=aggapi-hollow",
                        "--ignore-not-found", check=False)

    def _any_pod(self) -> bool:
        code, body = self.cp.get(f"/api/v1/pods?labelSelector={ROLLOUT_LABEL}%3D1&limit=1")
        return code == 200 and bool(json.loads(body).get("items"))

    def start_nodes(self) -> None:
        stages = self.cp.state / "kwok-stages.yaml"
        stages.write_text(STAGES.replace("@ADDRESS@", self.cp.node_host.address)
                          .replace("@PULLED@", "scale.aggapi.io/pulled"))
        if not self.cp.proc("kwok").alive():
            spawn("kwok", [binary("kwok"), f"--kubeconfig={self.cp.admin_kubeconfig}",
                           f"--config={stages}", "--manage-all-nodes=false",
                           f"--manage-nodes-with-label-selector={HOLLOW_LABEL}=true",
                           "--node-lease-duration-seconds=40"], self.cp.state)
        self.cp.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": n, "labels": {HOLLOW_LABEL: "true", "kubernetes.io/hostname": n,
                                  "kubernetes.io/os": "linux", "type": "kwok"}}}
            for n in self.node_names])
        self.cp.apply([{"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": self.namespace(i)}}
                       for i in range(self.namespaces)])
        wait_ready(lambda: self.ready_nodes() >= self.nodes, 120, "kwok's Nodes Ready",
                   self.cp.proc("kwok"))
        for i in range(self.namespaces):  # pods are refused until the controller made it
            sa = f"/api/v1/namespaces/{self.namespace(i)}/serviceaccounts/default"
            wait_ready(functools.partial(self._exists, sa), 60, "default ServiceAccounts")

    def _exists(self, path: str) -> bool:
        return self.cp.get(path)[0] == 200

    def ready_nodes(self) -> int:
        code, body = self.cp.get(f"/api/v1/nodes?labelSelector={HOLLOW_LABEL}%3Dtrue")
        if code != 200:
            return 0
        return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (n.get("status") or {}).get("conditions") or ())
                   for n in json.loads(body).get("items") or ())

    @property
    def hollow(self) -> Proc:
        return self.cp.proc("hollow")

    def start_hollow(self) -> None:
        ready = self.cp.state / "hollow.ready"
        if not self.hollow.alive():
            ready.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "tests.framework.hollow",
                    f"--kubeconfig={self.cp.admin_kubeconfig}",
                    f"--certs-dir={self.cp.aggapi_certs}", f"--state={self.cp.state}",
                    f"--namespace={NAMESPACE}", f"--address={self.cp.node_host.address}",
                    f"--base-port={self.base_port}", f"--nodes={','.join(self.node_names)}",
                    f"--slots={self.slots}", f"--seed={self.seed}",
                    f"--fail-fraction={self.fail_fraction}", f"--back-off={self.back_off}",
                    f"--slowdown={self.slowdown}"]
            spawn("hollow", [*self.cp.node_host.exec_prefix(), *argv], self.cp.state,
                  env=python_env())
        wait_ready(ready.exists, 120, "hollow agents", self.hollow)

    # --- the rollout ---------------------------------------------------------------------
    def pod(self, index: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"app-{index}", "namespace": self.namespace(index),
            "labels": {"app": "scale", ROLLOUT_LABEL: "1"}},
            "spec": {"nodeName": self.node_names[index % self.nodes],
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": image_of(index)}]}}

    def create_pods(self, count: int) -> float:
        """``count`` more pods (numbered on from the last); the seconds it took."""
        t0 = time.monotonic()
        asyncio.run(self._create(range(self.created, self.created + count)))
        self.created += count
        return time.monotonic() - t0

    async def _create(self, indexes: range) -> None:
        api = await load_client(str(self.cp.admin_kubeconfig))
        todo = iter(indexes)

        async def worker() -> None:
            for i in todo:
                for attempt in range(5):
                    try:
                        await api.post(f"/api/v1/namespaces/{self.namespace(i)}/pods",
                                       self.pod(i))
                        break
                    except KubeError as err:
                        if err.status == 409:
                            break
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.5)
        try:
            await asyncio.gather(*(worker() for _ in range(CREATORS)))
        finally:
            await api.close()

    def pod_keys(self, count: int | None = None) -> set[tuple[str, str]]:
        n = self.created if count is None else count
        return {(self.namespace(i), f"app-{i}") for i in range(n)}

    # --- what is measured ---------------------------------------------------------------
    def list_podimagepulls(self, namespace: str = "") -> tuple[float, float, list[dict[str, Any]]]:
        """(seconds to the head, seconds to the last byte, items) of one list through
        the aggregator, as admin."""
        where = f"/namespaces/{namespace}" if namespace else ""
        t0 = time.monotonic()
        for _ in range(10):  # client-go retries a 503 with Retry-After (aggapi's: 1-2 s)
            code, head, took, body = self.cp.timed_get(
                f"/apis/{GROUP}/{VERSION}{where}/podimagepulls", timeout=60)
            if code != 503:
                break
            time.sleep(1.0)
        if code != 200:
            raise HarnessError(f"list podimagepulls{where}: {code} {body[:300]!r}")
        waited = time.monotonic() - t0 - took  # the 503s before, and the pauses
        return head + waited, took + waited, list(json.loads(body).get("items") or ())

    def list_pages(self, path: str, limit: int = 500) -> tuple[float, int]:
        """(seconds, items) of a complete list of ``path`` (from the root, as admin) in
        pages of ``limit``, as kubectl get and client-go's reflector list."""
        t0, items, cont = time.monotonic(), 0, ""
        sep = "&" if "?" in path else "?"
        while True:
            query = f"{sep}limit={limit}"
            if cont:
                query += f"&continue={urllib.parse.quote(cont)}"
            code, body = self.cp.get(path + query, timeout=60)
            if code != 200:
                raise HarnessError(f"list {path}: {code} {body[:300]!r}")
            page = json.loads(body)
            items += len(page.get("items") or ())
            cont = str((page.get("metadata") or {}).get("continue") or "")
            if not cont:
                return time.monotonic() - t0, items

    def kube_watches(self) -> dict[str, float]:
        """kube-apiserver's WATCH requests in flight, by resource."""
        code, body = self.cp.get("/metrics", timeout=20)
        if code != 200:
            raise HarnessError(f"kube-apiserver /metrics: {code}")
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
                res = re.search(r'resource="([^"]*)"', line)
                key = res.group(1) if res else ""
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def aggapi_metrics(self) -> dict[str, float]:
        """aggapi's own gauges (``aggapi_*``, unlabelled samples), read with the admin
        client certificate (aggapi authenticates the cluster CA's certificates)."""
        ctx = ssl.create_default_context(cafile=str(self.cp.aggapi_certs / "ca.crt"))
        ctx.load_cert_chain(self.cp.pki_dir / "admin.crt", self.cp.pki_dir / "admin.key")
        url = f"https://{self.cp.api_host.address}:{AGGAPI_PORT}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            text = r.read().decode()
        return {name: float(value) for name, value in
                (line.split(" ", 1) for line in text.splitlines()
                 if line.startswith("aggapi_") and "{" not in line.split(" ", 1)[0])}

    def restart_aggapi(self, wait: float = 90.0) -> float:
        """SIGTERM the aggapi apiserver (as a roll does) and start it again with the same
        flags, until the aggregator serves it: the seconds that took. Its next list is
        the first of a replica that starts (or newly leads) with nothing built."""
        t0 = time.monotonic()
        self.cp.proc("aggapi-apiserver").stop(timeout=30)
        self.cp.start_apiserver(wait=wait)
        return time.monotonic() - t0

    def done_times(self, log: str = DONE_LOG) -> dict[tuple[str, str], float]:
        """When each pod's pull finished in the simulation (CLOCK_MONOTONIC); with
        ``hollow.POSTED_LOG``, when its Pulled Event was written."""
        path = self.hollow_dir / log
        out: dict[tuple[str, str], float] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                t, _, key = line.partition(" ")
                ns, _, name = key.partition("/")
                out.setdefault((ns, name), float(t))
        return out


class TableWatch:
    """``kubectl get podimagepulls -A -w``: the Table rows kubectl prints, the latest
    phase of each pod, and when kubectl first printed it Done (CLOCK_MONOTONIC)."""

    def __init__(self, cp: ControlPlane, args: Sequence[str] = ("-A",)) -> None:
        self.proc = subprocess.Popen(
            [binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "get",
             "podimagepulls", *args, "-w"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.columns: list[str] = []
        self.phase: dict[tuple[str, str], str] = {}
        self.node: dict[tuple[str, str], str] = {}
        self.done_at: dict[tuple[str, str], float] = {}
        self.seen_phases: dict[tuple[str, str], set[str]] = {}
        self.rows = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            cells = line.split()
            if not self.columns:
                self.columns = cells
                continue
            if len(cells) < len(self.columns) - 1:  # REASON may be wide: not needed
                continue
            row = dict(zip(self.columns, cells, strict=False))
            key = (row.get("NAMESPACE", ""), row.get("NAME", ""))
            with self._lock:
                self.rows += 1
                self.phase[key] = row.get("PHASE", "")
                self.seen_phases.setdefault(key, set()).add(self.phase[key])
                self.node[key] = row.get("NODE", "")
                if row.get("PHASE") == "Done":
                    self.done_at.setdefault(key, now)

    def done(self, keys: set[tuple[str, str]]) -> int:
        with self._lock:
            return len(keys & self.done_at.keys())

    def wait_done(self, keys: set[tuple[str, str]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.done(keys) == len(keys):
                return True
            if self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise HarnessError(f"kubectl get -w exited {self.proc.returncode}: {err}")
            time.sleep(0.25)
        return False

    def stop(self) -> None:
        stop_child(self.proc)
