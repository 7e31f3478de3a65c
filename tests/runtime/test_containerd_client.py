"""ContainerdClient against a real containerd, after pulls driven through CRI."""

from __future__ import annotations

import json

import pytest

from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeNotFound
from tests.conftest import SharedImages
from tests.framework import oci
from tests.framework.containerd import Containerd
from tests.framework.registry import Registry


async def test_version(ctd: ContainerdClient, containerd: Containerd) -> None:
    # The flavour the harness chose (AGGAPI_CONTAINERD) is the one that answers.
    assert (await ctd.version()).startswith(containerd.flavor.version_prefix())
    assert ctd.rpc_count == 1


async def test_image_and_content_after_pull(cri: CRIClient, ctd: ContainerdClient,
                                            busybox_image: str,
                                            oci_cache: oci.BlobCache) -> None:
    assert await ctd.get_image(busybox_image) is None
    await cri.pull_image(busybox_image)
    rec = await ctd.get_image(busybox_image)
    expected = oci.busybox_image(oci_cache)
    assert rec is not None
    assert rec.target.digest == expected.digest
    assert rec.target.media_type == oci.MEDIA_MANIFEST
    assert rec.target.size == expected.manifest.size
    assert rec.created_at > 0
    assert busybox_image in {i.name for i in await ctd.list_images()}
    assert [i.name for i in await ctd.list_images([f'name=="{busybox_image}"'])] == [busybox_image]

    manifest = await ctd.read_content(rec.target.digest)
    assert manifest == expected.manifest.read()
    assert json.loads(manifest)["layers"][0]["digest"] == expected.layers[0].blob.digest
    assert await ctd.read_content(rec.target.digest, offset=2, size=5) == manifest[2:7]
    # A size cap larger than the blob (as manifest readers pass) reads to the end.
    assert await ctd.read_content(rec.target.digest, 0, 4 << 20) == manifest
    with pytest.raises(RuntimeNotFound):
        await ctd.read_content("sha256:" + "1" * 64)

    info = await ctd.content_info(rec.target.digest)
    assert info is not None and info.size == len(manifest)
    assert info.labels["containerd.io/gc.ref.content.l.0"] == expected.layers[0].blob.digest
    assert info.labels["containerd.io/gc.ref.content.config"] == expected.config_digest
    layer = await ctd.content_info(expected.layers[0].blob.digest)
    assert layer is not None and layer.size == expected.layers[0].blob.size
    assert layer.labels["containerd.io/uncompressed"] == expected.layers[0].diff_id
    # The busybox layer is also the pause image's: whichever repo brought it first names it.
    sources = layer.labels["containerd.io/distribution.source.127.0.0.1"].split(",")
    assert set(sources) & {"aggapi-test/busybox", "aggapi-test/pause"}, sources
    assert await ctd.content_info("sha256:" + "0" * 64) is None


async def test_snapshots_after_pull(cri: CRIClient, ctd: ContainerdClient,
                                    containerd: Containerd, registry: Registry,
                                    shared_images: SharedImages) -> None:
    await cri.pull_image(shared_images.a.ref(registry.host))
    committed = {s.name: s for s in await ctd.list_snapshots(containerd.snapshotter)
                 if s.kind == "committed"}
    # Two layers -> a chain of two committed snapshots: top's parent is base.
    tops = [s for s in committed.values() if s.parent in committed]
    assert len(tops) >= 1, committed
    assert committed[tops[0].parent].parent == ""
    assert all(s.created_at > 0 for s in committed.values())
    assert not [s for s in await ctd.list_snapshots(containerd.snapshotter) if s.kind == "active"]
