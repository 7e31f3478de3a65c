"""CRIClient against a real containerd: images and a running busybox pod."""

from __future__ import annotations

import asyncio
import os

from aggapi.runtime.cri import CRIClient
from tests.framework.containerd import Containerd
from tests.framework.pods import CONTAINER_NAME, POD_UID, ContainerSpec, PodRunner


async def exists(path: str) -> bool:
    return await asyncio.to_thread(os.path.exists, path)


async def test_version(cri: CRIClient, containerd: Containerd) -> None:
    v = await cri.version()
    assert v.runtime_name == "containerd"
    assert v.runtime_api_version == "v1"
    assert v.runtime_version.startswith(containerd.flavor.version_prefix())


async def test_pull_status_list_remove(cri: CRIClient, busybox_image: str) -> None:
    assert await cri.image_status(busybox_image) is None
    ref = await cri.pull_image(busybox_image)
    assert ref.startswith("sha256:")
    info = await cri.image_status(busybox_image)
    assert info is not None and info.id == ref
    assert busybox_image in info.repo_tags
    assert any(d.startswith(busybox_image.rsplit(":", 1)[0] + "@sha256:")
               for d in info.repo_digests)
    assert info.size > 500_000  # busybox-static, gzip'd
    assert ref in {i.id for i in await cri.list_images()}
    await cri.remove_image(busybox_image)
    assert await cri.image_status(busybox_image) is None
    await cri.remove_image(busybox_image)  # idempotent


async def test_run_pod_and_find_pid(cri: CRIClient, pods: PodRunner,
                                    busybox_image: str) -> None:
    pod = await pods.run_pod("web", [ContainerSpec(
        "main", busybox_image, command=["/bin/busybox", "sleep", "3600"])],
        namespace="ns1")
    sandboxes = await cri.list_pod_sandboxes({POD_UID: pod.uid})
    assert [s.id for s in sandboxes] == [pod.sandbox_id]
    sb = sandboxes[0]
    assert (sb.name, sb.namespace, sb.uid, sb.state) == ("web", "ns1", pod.uid, "SANDBOX_READY")
    assert await cri.list_pod_sandboxes({POD_UID: "no-such-uid"}) == []

    containers = await cri.list_containers(sandbox_id=pod.sandbox_id)
    assert len(containers) == 1
    c = containers[0]
    assert (c.name, c.state, c.labels[CONTAINER_NAME]) == ("main", "CONTAINER_RUNNING", "main")
    assert c.image_ref.startswith("sha256:")
    assert [x.id for x in await cri.list_containers(labels={CONTAINER_NAME: "main",
                                                             POD_UID: pod.uid})] == [c.id]

    st = await cri.container_status(c.id)
    assert st is not None and st.state == "CONTAINER_RUNNING"
    assert st.pid is not None and st.pid > 1
    assert st.runtime_type == "io.containerd.runc.v2"
    # The pid is a host pid whose root is the container's rootfs.
    assert await exists(f"/proc/{st.pid}/root/bin/busybox")
    assert not await exists(f"/proc/{st.pid}/root/usr/bin/containerd")
    assert await cri.container_status("0" * 64) is None

    await cri.stop_container(c.id, grace=0)
    st = await cri.container_status(c.id)
    assert st is not None and st.state == "CONTAINER_EXITED" and st.pid is None
    assert st.exit_code != 0  # killed


async def test_no_shell_image_runs(cri: CRIClient, pods: PodRunner, noshell_image: str) -> None:
    pod = await pods.run_pod("noshell", [ContainerSpec("app", noshell_image)])
    st = await cri.container_status(pod.containers["app"])
    assert st is not None and st.state == "CONTAINER_RUNNING" and st.pid
    root = f"/proc/{st.pid}/root"
    assert await exists(f"{root}/app")
    assert not await exists(f"{root}/bin/sh") and not await exists(f"{root}/bin/tar")
