"""A kubelet stand-in: run pod sandboxes and containers through CRI the way kubelet
does (same labels, host network), and remove them again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggapi.runtime.cri import CRIClient, cri
from aggapi.runtime.errors import RuntimeCallError
from tests.framework.containerd import remove_cgroup_tree

log = logging.getLogger(__name__)

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    command: Sequence[str] = ()
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # (host_path, container_path, readonly)
    mounts: Sequence[tuple[str, str, bool]] = ()
    run_as_user: int | None = None  # securityContext.runAsUser
    run_as_group: int | None = None  # securityContext.runAsGroup


@dataclass
class RunningPod:
    name: str
    namespace: str
    uid: str
    sandbox_id: str
    config: cri.PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id


def _id(value: int | None) -> cri.Int64Value | None:
    return None if value is None else cri.Int64Value(value=value)


class PodRunner:
    """Runs pods on a CRI runtime; remembers them so ``remove_all`` cleans up."""

    def __init__(self, client: CRIClient, *, cgroup_parent: str, log_root: Path) -> None:
        self.cri = client
        self.cgroup_parent = cgroup_parent
        self.log_root = log_root
        self.pods: list[RunningPod] = []

    def sandbox_config(self, name: str, namespace: str, uid: str) -> cri.PodSandboxConfig:
        labels = {POD_NAME: name, POD_NAMESPACE: namespace, POD_UID: uid}
        logdir = self.log_root / f"{namespace}_{name}_{uid}"
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, namespace=namespace, uid=uid),
            log_directory=str(logdir),
            labels=labels,
            annotations={"kubernetes.io/config.source": "api"},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=f"{self.cgroup_parent}/pod{uid}",
                security_context=cri.LinuxSandboxSecurityContext(
                    # hostNetwork: no CNI needed.
                    namespace_options=cri.NamespaceOption(
                        network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD),
                ),
            ),
        )

    async def run_pod(self, name: str, containers: Sequence[ContainerSpec], *,
                      namespace: str = "default", uid: str | None = None,
                      pull: bool = True) -> RunningPod:
        """Sandbox, then per container: pull if missing (IfNotPresent), create, start."""
        uid = uid or str(uuid.uuid4())
        config = self.sandbox_config(name, namespace, uid)
        await asyncio.to_thread(Path(config.log_directory).mkdir, parents=True, exist_ok=True)
        sandbox_id = await self.cri.run_pod_sandbox(config)
        pod = RunningPod(name, namespace, uid, sandbox_id, config)
        self.pods.append(pod)
        for spec in containers:
            if pull and await self.cri.image_status(spec.image) is None:
                await self.cri.pull_image(spec.image, config)
            cconf = cri.ContainerConfig(
                metadata=cri.ContainerMetadata(name=spec.name),
                image=cri.ImageSpec(image=spec.image),
                command=list(spec.command),
                args=list(spec.args),
                envs=[cri.KeyValue(key=k, value=v) for k, v in spec.env.items()],
                mounts=[cri.Mount(host_path=h, container_path=c, readonly=ro)
                        for h, c, ro in spec.mounts],
                labels={**config.labels, CONTAINER_NAME: spec.name},
                log_path=f"{spec.name}/0.log",
                linux=cri.LinuxContainerConfig(
                    security_context=cri.LinuxContainerSecurityContext(
                        namespace_options=cri.NamespaceOption(
                            network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD),
                        run_as_user=_id(spec.run_as_user),
                        run_as_group=_id(spec.run_as_group))),
            )
            cid = await self.cri.create_container(sandbox_id, cconf, config)
            pod.containers[spec.name] = cid
            await self.cri.start_container(cid)
        return pod

    async def remove_pod(self, pod: RunningPod) -> None:
        """Stop and remove containers then the sandbox, as kubelet does on delete."""
        for cid in pod.containers.values():
            with contextlib.suppress(RuntimeCallError):
                await self.cri.stop_container(cid, grace=0)
            with contextlib.suppress(RuntimeCallError):
                await self.cri.remove_container(cid)
        for step in (self.cri.stop_pod_sandbox, self.cri.remove_pod_sandbox):
            try:
                await step(pod.sandbox_id)
            except RuntimeCallError as err:
                log.warning("%s %s: %s", step.__name__, pod.sandbox_id, err)
        await asyncio.to_thread(remove_cgroup_tree, f"{self.cgroup_parent}/pod{pod.uid}")
        if pod in self.pods:
            self.pods.remove(pod)

    async def remove_all(self) -> None:
        for pod in list(self.pods):
            await self.remove_pod(pod)
