"""Make the next pod pull an image again: remove it from the node's containerd, with the
sandboxes that still hold its layers."""

from __future__ import annotations

import asyncio
import time

from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeCallError, RuntimeNotFound


async def _remove_sandbox(cri: CRIClient, sandbox_id: str, timeout: float = 30.0) -> None:
    """Stop and remove a sandbox that kubelet may be tearing down at the same moment: the
    CNI delete of whichever stop comes second can fail ("failed to delete eth0: no such
    device") while the first is still under way. A stop is idempotent once the first has
    finished, so retry until it succeeds or the sandbox is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await cri.stop_pod_sandbox(sandbox_id)
            await cri.remove_pod_sandbox(sandbox_id)
            return
        except RuntimeNotFound:
            return
        except RuntimeCallError:
            if sandbox_id not in {s.id for s in await cri.list_pod_sandboxes()}:
                return
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def forget_images(cri_address: str, *repos: str) -> None:
    """Remove images (every tag and digest of these repositories) so the next pod pulls
    them again. Sandboxes whose containers use them (left by pods just deleted; kubelet
    tears them down in its own time) go first: their snapshots would otherwise keep the
    layers, and containerd's next pull would skip them (nothing downloaded)."""

    def ours(name: str) -> bool:
        return any(name.split("/", 1)[-1].split("@")[0].split(":")[0] == r.split(":")[0]
                   for r in repos)

    async with CRIClient(cri_address) as cri:
        images = [img for img in await cri.list_images()
                  if any(ours(n) for n in (*img.repo_tags, *img.repo_digests))]
        ids = {img.id for img in images}
        holders = {c.sandbox_id for c in await cri.list_containers()
                   if ours(c.image) or c.image_ref in ids or c.image in ids}
        for sb in holders:
            await _remove_sandbox(cri, sb)
        for img in images:
            await cri.remove_image(img.id)
