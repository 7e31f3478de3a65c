"""Client for the CRI v1 RuntimeService and ImageService (what kubelet speaks).

Read calls return frozen dataclasses. Calls that create things (sandboxes,
containers) take the CRI request messages re-exported here, since their configs
are large and only tests and the kubelet stand-in build them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.proto import cri_pb2, cri_pb2_grpc
from aggapi.runtime.channel import ChannelClient, call
from aggapi.runtime.errors import RuntimeNotFound

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "/run/containerd/containerd.sock"

# CRI message types callers may build (re-exported so nobody imports aggapi.proto).
PodSandboxConfig = cri_pb2.PodSandboxConfig
PodSandboxMetadata = cri_pb2.PodSandboxMetadata
ContainerConfig = cri_pb2.ContainerConfig
ContainerMetadata = cri_pb2.ContainerMetadata
ImageSpec = cri_pb2.ImageSpec
NamespaceMode = cri_pb2.NamespaceMode
cri = cri_pb2  # full access for rarely-used fields


@dataclass(frozen=True)
class RuntimeVersion:
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class Sandbox:
    id: str
    name: str
    namespace: str
    uid: str
    state: str  # "SANDBOX_READY" | "SANDBOX_NOTREADY"
    labels: dict[str, str]
    annotations: dict[str, str]
    runtime_handler: str


@dataclass(frozen=True)
class Container:
    id: str
    sandbox_id: str
    name: str
    image: str
    image_ref: str
    state: str  # "CONTAINER_CREATED" | "CONTAINER_RUNNING" | "CONTAINER_EXITED" | ...
    labels: dict[str, str]


@dataclass(frozen=True)
class ContainerStatus:
    id: str
    name: str
    state: str
    pid: int | None  # init pid on the host (from verbose info); None if not running
    exit_code: int
    reason: str
    message: str
    runtime_type: str | None  # e.g. "io.containerd.runc.v2"; Kata & co. are refused by copy
    info: dict[str, Any]  # verbose info, JSON values decoded


def _image_info(img: cri_pb2.Image) -> ImageInfo:
    return ImageInfo(id=img.id, repo_tags=tuple(img.repo_tags),
                     repo_digests=tuple(img.repo_digests), size=img.size)


def _decode_info(info: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in info.items():
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


class CRIClient(ChannelClient):
    """Async CRI v1 client on a unix socket (containerd's or CRI-O's)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float = 30.0,
                 pull_timeout: float | None = None) -> None:
        super().__init__(address)
        self.timeout = timeout
        self.pull_timeout = pull_timeout  # None: a pull may take as long as it takes
        self._rt = cri_pb2_grpc.RuntimeServiceStub(self._channel)
        self._img = cri_pb2_grpc.ImageServiceStub(self._channel)

    # --- runtime ---------------------------------------------------------------

    async def version(self) -> RuntimeVersion:
        r = await call("Version", self._rt.Version, cri_pb2.VersionRequest(version="v1"),
                       deadline=self.timeout)
        return RuntimeVersion(r.runtime_name, r.runtime_version, r.runtime_api_version)

    async def list_pod_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[Sandbox]:
        req = cri_pb2.ListPodSandboxRequest(
            filter=cri_pb2.PodSandboxFilter(label_selector=dict(labels or {})))
        r = await call("ListPodSandbox", self._rt.ListPodSandbox, req, deadline=self.timeout)
        return [
            Sandbox(id=s.id, name=s.metadata.name, namespace=s.metadata.namespace,
                    uid=s.metadata.uid, state=cri_pb2.PodSandboxState.Name(s.state),
                    labels=dict(s.labels), annotations=dict(s.annotations),
                    runtime_handler=s.runtime_handler)
            for s in r.items
        ]

    async def list_containers(self, sandbox_id: str | None = None,
                              labels: Mapping[str, str] | None = None) -> list[Container]:
        req = cri_pb2.ListContainersRequest(filter=cri_pb2.ContainerFilter(
            pod_sandbox_id=sandbox_id or "", label_selector=dict(labels or {})))
        r = await call("ListContainers", self._rt.ListContainers, req, deadline=self.timeout)
        return [
            Container(id=c.id, sandbox_id=c.pod_sandbox_id, name=c.metadata.name,
                      image=c.image.image, image_ref=c.image_ref,
                      state=cri_pb2.ContainerState.Name(c.state), labels=dict(c.labels))
            for c in r.containers
        ]

    async def container_status(self, container_id: str,
                               verbose: bool = True) -> ContainerStatus | None:
        req = cri_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        try:
            r = await call("ContainerStatus", self._rt.ContainerStatus, req,
                           deadline=self.timeout)
        except RuntimeNotFound:
            return None
        s = r.status
        info = _decode_info(r.info)
        # containerd puts the task's init pid and runtime into info["info"].
        detail = info.get("info") if isinstance(info.get("info"), dict) else {}
        pid = detail.get("pid") if isinstance(detail, dict) else None
        rtype = detail.get("runtimeType") if isinstance(detail, dict) else None
        return ContainerStatus(
            id=s.id, name=s.metadata.name, state=cri_pb2.ContainerState.Name(s.state),
            pid=pid if isinstance(pid, int) and pid > 0 else None,
            exit_code=s.exit_code, reason=s.reason, message=s.message,
            runtime_type=rtype if isinstance(rtype, str) and rtype else None, info=info,
        )

    async def run_pod_sandbox(self, config: cri_pb2.PodSandboxConfig,
                              runtime_handler: str = "") -> str:
        req = cri_pb2.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        r = await call("RunPodSandbox", self._rt.RunPodSandbox, req, deadline=self.timeout)
        return str(r.pod_sandbox_id)

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await call("StopPodSandbox", self._rt.StopPodSandbox,
                   cri_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
                   deadline=self.timeout)

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await call("RemovePodSandbox", self._rt.RemovePodSandbox,
                   cri_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
                   deadline=self.timeout)

    async def create_container(self, sandbox_id: str, config: cri_pb2.ContainerConfig,
                               sandbox_config: cri_pb2.PodSandboxConfig) -> str:
        req = cri_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config,
                                             sandbox_config=sandbox_config)
        r = await call("CreateContainer", self._rt.CreateContainer, req, deadline=self.timeout)
        return str(r.container_id)

    async def start_container(self, container_id: str) -> None:
        await call("StartContainer", self._rt.StartContainer,
                   cri_pb2.StartContainerRequest(container_id=container_id),
                   deadline=self.timeout)

    async def stop_container(self, container_id: str, grace: int = 0) -> None:
        """Stop with a grace period of ``grace`` seconds (0: kill at once)."""
        await call("StopContainer", self._rt.StopContainer,
                   cri_pb2.StopContainerRequest(container_id=container_id, timeout=grace),
                   deadline=self.timeout + grace)

    async def remove_container(self, container_id: str) -> None:
        await call("RemoveContainer", self._rt.RemoveContainer,
                   cri_pb2.RemoveContainerRequest(container_id=container_id),
                   deadline=self.timeout)

    # --- images ----------------------------------------------------------------

    async def pull_image(self, image: str,
                         sandbox_config: cri_pb2.PodSandboxConfig | None = None) -> str:
        """Pull as kubelet does; returns the image ref (``sha256:<config digest>``)."""
        req = cri_pb2.PullImageRequest(image=cri_pb2.ImageSpec(image=image))
        if sandbox_config is not None:
            req.sandbox_config.CopyFrom(sandbox_config)
        r = await call("PullImage", self._img.PullImage, req, deadline=self.pull_timeout)
        return str(r.image_ref)

    async def image_status(self, image: str) -> ImageInfo | None:
        req = cri_pb2.ImageStatusRequest(image=cri_pb2.ImageSpec(image=image))
        try:
            r = await call("ImageStatus", self._img.ImageStatus, req, deadline=self.timeout)
        except RuntimeNotFound:
            return None
        return _image_info(r.image) if r.HasField("image") else None

    async def list_images(self) -> list[ImageInfo]:
        r = await call("ListImages", self._img.ListImages, cri_pb2.ListImagesRequest(),
                       deadline=self.timeout)
        return [_image_info(i) for i in r.images]

    async def remove_image(self, image: str) -> None:
        """Idempotent, as CRI requires: a missing image is not an error."""
        try:
            await call("RemoveImage", self._img.RemoveImage,
                       cri_pb2.RemoveImageRequest(image=cri_pb2.ImageSpec(image=image)),
                       deadline=self.timeout)
        except RuntimeNotFound:
            log.debug("remove_image: %s already gone", image)
