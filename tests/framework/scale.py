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
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aggapi.kube.client import KubeError, load_client
from tests.framework.controlplane import NAMESPACE, ControlPlane, binary
from tests.framework.kwokstages import STAGES
from tests.framework.procs import HarnessError, Proc, spawn, wait_ready
from tests.framework.repo import python_env
from tests.framework.scalemeasure import ScaleMeasures
from tests.framework.tablewatch import TableWatch  # noqa: F401  (its users import it here)

HOLLOW_LABEL = "aggapi.io/hollow"
ROLLOUT_LABEL = "scale.aggapi.io/rollout"
IMAGE_HOST = "registry.scale.test"
CREATORS = 16  # pods created concurrently


def image_of(index: int) -> str:
    """Pod ``index``'s image: one repository per pod, so each has a pull of its own."""
    return f"{IMAGE_HOST}/rollout/app-{index}:v1"


@dataclass
class ScaleCluster(ScaleMeasures):
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
