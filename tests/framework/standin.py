"""A kubelet stand-in for the harness node: fast, deterministic pods without a kubelet.

It does what kubelet would for a pod bound to the node, against the real kube-apiserver
and the node's real containerd:

- creates the Pod object with ``spec.nodeName`` = the harness node (kube-scheduler
  is not asked);
- pulls each container's image through CRI when missing (``IfNotPresent``), posting
  kubelet's events with kubelet's reasons, messages and names (``<pod>.<unixnano hex>``,
  ``involvedObject.uid``, ``fieldPath: spec.containers{name}``): ``Pulling``,
  ``Pulled`` ("Successfully pulled image ..." / "Container image ... already present on
  machine"), ``Failed`` ("Failed to pull image "x": <CRI's error>", then
  "Error: ErrImagePull"), ``BackOff`` ("Back-off pulling image ..."), then
  "Error: ImagePullBackOff";
- runs the sandbox and containers through CRI with kubelet's labels and the Pod's real
  uid (tests.framework.pods.PodRunner), host network;
- patches ``status`` as kubelet does: Pending/ContainerCreating, ErrImagePull /
  ImagePullBackOff, Running with container IDs and image IDs, terminated when stopped.

The node side (containerd, registry, agent) is tests.framework.node; the real kubelet
(tests.framework.kubelet) runs on the same node. It talks to kube-apiserver with the
product's own client, aggapi.kube.client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aggapi.kube.client import KubeClient, KubeError, load_client, path_segment
from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeCallError
from tests.framework.node import Node
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod

CONTAINERD = "containerd://"
T = TypeVar("T")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pods_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{path_segment(namespace)}/pods"
    return f"{base}/{path_segment(name)}" if name else base


@dataclass
class StandinPod:
    name: str
    namespace: str
    uid: str
    specs: tuple[ContainerSpec, ...]
    obj: dict[str, Any]
    running: RunningPod | None = None
    pull_errors: dict[str, str] = field(default_factory=dict)  # container -> CRI's error

    def container_id(self, name: str) -> str:
        assert self.running is not None, "pod not started"
        return self.running.containers[name]


class StandinKubelet:
    """Use as ``async with StandinKubelet(kubeconfig, node_name, cri_address, ...)``."""

    def __init__(self, kubeconfig: str | Path, *, node_name: str, node_address: str,
                 cri_address: str, cgroup_parent: str, log_root: Path) -> None:
        self.kubeconfig = str(kubeconfig)
        self.node_name = node_name
        self.node_address = node_address
        self.cri_address = cri_address
        self.cgroup_parent = cgroup_parent
        self.log_root = log_root
        self._kube: KubeClient | None = None
        self._cri: CRIClient | None = None
        self._runner: PodRunner | None = None
        self.pods: dict[tuple[str, str], StandinPod] = {}

    @classmethod
    def for_node(cls, node: Node) -> StandinKubelet:
        """For the node's pods, as the control plane's admin."""
        return cls(node.cp.admin_kubeconfig, node_name=node.name,
                   node_address=node.cp.node_host.address, cri_address=node.cri_address,
                   cgroup_parent=node.info.cgroup_parent, log_root=node.pods_dir)

    async def __aenter__(self) -> StandinKubelet:
        self._kube = await load_client(self.kubeconfig)
        self._cri = CRIClient(self.cri_address)
        self._runner = PodRunner(self._cri, cgroup_parent=self.cgroup_parent,
                                 log_root=self.log_root)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._cri is not None:
            await self._cri.close()
        if self._kube is not None:
            await self._kube.close()

    @property
    def kube(self) -> KubeClient:
        assert self._kube is not None, "use StandinKubelet as an async context manager"
        return self._kube

    @property
    def cri(self) -> CRIClient:
        assert self._cri is not None, "use StandinKubelet as an async context manager"
        return self._cri

    # --- pods ------------------------------------------------------------------------
    async def create(self, name: str, containers: Sequence[ContainerSpec], *,
                     namespace: str = "default", node_name: str | None = None,
                     labels: Mapping[str, str] | None = None) -> StandinPod:
        """The Pod object, bound to the node (or ``node_name``: "" leaves it unscheduled)."""
        spec: dict[str, Any] = {
            "containers": [
                {"name": c.name, "image": c.image, "imagePullPolicy": "IfNotPresent",
                 **({"command": list(c.command)} if c.command else {}),
                 **({"args": list(c.args)} if c.args else {}),
                 **({"env": [{"name": k, "value": v} for k, v in c.env.items()]}
                    if c.env else {})}
                for c in containers],
            "hostNetwork": True,  # PodRunner runs sandboxes in the node's network
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
        }
        node = self.node_name if node_name is None else node_name
        if node:
            spec["nodeName"] = node
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": dict(labels or {"app.kubernetes.io/part-of":
                                                       "aggapi-standin"})},
                "spec": spec}
        obj = await self.kube.post(pods_path(namespace), body)
        pod = StandinPod(name, namespace, obj["metadata"]["uid"], tuple(containers), obj)
        self.pods[(namespace, name)] = pod
        if node == self.node_name:
            await self._status(pod, phase="Pending", containers={
                c.name: {"state": {"waiting": {"reason": "ContainerCreating"}}}
                for c in containers})
        return pod

    async def start(self, pod: StandinPod) -> StandinPod:
        """Pull (with kubelet's events), then run sandbox and containers; status Running.

        A failed pull leaves the pod Pending with ErrImagePull -> ImagePullBackOff
        and no sandbox, as kubelet's status would show (no retries)."""
        image_ids: dict[str, str] = {}
        for spec in pod.specs:
            image_id = await self.pull(pod, spec)
            if image_id is None:
                return pod
            image_ids[spec.name] = image_id
        assert self._runner is not None
        pod.running = await self._runner.run_pod(pod.name, pod.specs, namespace=pod.namespace,
                                                 uid=pod.uid, pull=False)
        for spec in pod.specs:
            await self.event(pod, spec.name, "Created", f"Created container {spec.name}")
            await self.event(pod, spec.name, "Started", f"Started container {spec.name}")
        now = _now()
        await self._status(pod, phase="Running", ready=True, containers={
            s.name: {"state": {"running": {"startedAt": now}}, "ready": True, "started": True,
                     "imageID": image_ids[s.name],
                     "containerID": CONTAINERD + pod.container_id(s.name)}
            for s in pod.specs})
        return pod

    async def run(self, name: str, containers: Sequence[ContainerSpec], *,
                  namespace: str = "default") -> StandinPod:
        return await self.start(await self.create(name, containers, namespace=namespace))

    async def pull(self, pod: StandinPod, spec: ContainerSpec) -> str | None:
        """IfNotPresent, as kubelet: returns the image's ID (repo digest), None on failure."""
        image = spec.image
        present = await self.cri.image_status(image)
        if present is not None:
            await self.event(pod, spec.name, "Pulled",
                             f'Container image "{image}" already present on machine')
            return self._image_id(present.repo_digests, present.id)
        await self.event(pod, spec.name, "Pulling", f'Pulling image "{image}"')
        t0 = time.monotonic()
        try:
            await self.cri.pull_image(image)
        except RuntimeCallError as err:
            text = err.details
            pod.pull_errors[spec.name] = text
            await self.event(pod, spec.name, "Failed",
                             f'Failed to pull image "{image}": {text}', warning=True)
            await self.event(pod, spec.name, "Failed", "Error: ErrImagePull", warning=True)
            await self._status(pod, phase="Pending", containers={spec.name: {"state": {
                "waiting": {"reason": "ErrImagePull", "message": text}}}})
            await self.event(pod, spec.name, "BackOff", f'Back-off pulling image "{image}"')
            await self.event(pod, spec.name, "Failed", "Error: ImagePullBackOff",
                             warning=True)
            await self._status(pod, phase="Pending", containers={spec.name: {"state": {
                "waiting": {"reason": "ImagePullBackOff",
                            "message": f'Back-off pulling image "{image}": '
                                       f"ErrImagePull: {text}"}}}})
            return None
        took = time.monotonic() - t0
        info = await self.cri.image_status(image)
        size = info.size if info else 0
        await self.event(pod, spec.name, "Pulled",
                         f'Successfully pulled image "{image}" in {took:.3f}s '
                         f"({took:.3f}s including waiting). Image size: {size} bytes.")
        return self._image_id(info.repo_digests if info else (), info.id if info else "")

    @staticmethod
    def _image_id(repo_digests: Sequence[str], image_id: str) -> str:
        return repo_digests[0] if repo_digests else image_id

    async def stop_container(self, pod: StandinPod, name: str) -> None:
        """The container exits (killed); kubelet reports it terminated."""
        await self.cri.stop_container(pod.container_id(name), grace=0)
        await self._status(pod, phase="Running", ready=False, containers={name: {
            "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                     "finishedAt": _now()}},
            "ready": False, "started": False,
            "containerID": CONTAINERD + pod.container_id(name)}})

    async def delete(self, pod: StandinPod) -> None:
        """Remove containers and sandbox, then the Pod object (grace 0)."""
        if pod.running is not None and self._runner is not None:
            await self._runner.remove_pod(pod.running)
            pod.running = None
        with contextlib.suppress(KubeError):
            await self.kube.delete(pods_path(pod.namespace, pod.name),
                                   {"gracePeriodSeconds": 0})
        self.pods.pop((pod.namespace, pod.name), None)

    async def delete_all(self) -> None:
        for pod in list(self.pods.values()):
            await self.delete(pod)

    async def remove_image(self, image: str) -> None:
        """Remove an image (its blobs and snapshots go with it unless still in use)."""
        with contextlib.suppress(RuntimeCallError):
            await self.cri.remove_image(image)

    # --- events and status -----------------------------------------------------------
    async def event(self, pod: StandinPod, container: str, reason: str, message: str, *,
                    warning: bool = False) -> None:
        now_ns = time.time_ns()
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ns / 1e9))
        body = {
            "apiVersion": "v1", "kind": "Event",
            # kubelet's naming: "<pod>.<unix nanoseconds in hex>", so names sort by time.
            "metadata": {"name": f"{pod.name}.{now_ns:x}", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                               "namespace": pod.namespace, "uid": pod.uid,
                               "fieldPath": f"spec.containers{{{container}}}"},
            "reason": reason, "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet", "reportingInstance": self.node_name,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }
        await self.kube.post(f"/api/v1/namespaces/{path_segment(pod.namespace)}/events", body)

    async def _status(self, pod: StandinPod, *, phase: str, ready: bool = False,
                      containers: Mapping[str, Mapping[str, Any]]) -> None:
        """Merge ``containers`` (name -> fields) into status.containerStatuses."""
        current = {cs["name"]: cs for cs in
                   (pod.obj.get("status") or {}).get("containerStatuses") or ()}
        statuses = []
        for spec in pod.specs:
            cs = {"name": spec.name, "image": spec.image, "imageID": "", "ready": False,
                  "restartCount": 0, "started": False,
                  "state": {"waiting": {"reason": "ContainerCreating"}},
                  **current.get(spec.name, {})}
            if spec.name in containers:
                cs.update(containers[spec.name])
            statuses.append(cs)
        now = _now()
        cond = "True" if ready else "False"
        status = {
            "phase": phase, "hostIP": self.node_address, "podIP": self.node_address,
            "podIPs": [{"ip": self.node_address}], "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": cond, "lastTransitionTime": now},
                {"type": "Ready", "status": cond, "lastTransitionTime": now}],
            "containerStatuses": statuses,
        }
        old_start = (pod.obj.get("status") or {}).get("startTime")
        if old_start:
            status["startTime"] = old_start
        pod.obj = await self.kube.patch(pods_path(pod.namespace, pod.name) + "/status",
                                        {"status": status})


async def wait_for(pred: Any, timeout: float, interval: float = 0.1) -> None:
    """Poll an async predicate until true (TimeoutError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(interval)


class SyncStandin:
    """Blocking facade for synchronous code (pytest fixtures, CLIs): each call runs on a
    fresh event loop in a worker thread, so it works whether or not the caller's thread
    has a running loop. ``call`` waits; ``spawn`` returns a future (a pull in the
    background)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="standin")

    def _run(self, fn: Callable[[StandinKubelet], Awaitable[T]]) -> T:
        async def go() -> T:
            async with StandinKubelet.for_node(self.node) as kubelet:
                return await fn(kubelet)

        return asyncio.run(go())

    def spawn(self, fn: Callable[[StandinKubelet], Awaitable[T]]) -> concurrent.futures.Future[T]:
        return self._pool.submit(self._run, fn)

    def call(self, fn: Callable[[StandinKubelet], Awaitable[T]], timeout: float = 300) -> T:
        return self.spawn(fn).result(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
