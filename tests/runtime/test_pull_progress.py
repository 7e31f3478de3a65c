"""What a pull looks like from containerd's side while CRI PullImage runs, as kubelet
drives it: in-flight ingests with advancing offsets, a lease per pull, then the
image record, snapshots and content. The registry sits behind a throttling proxy."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from tests.conftest import ARCH, RepoImage, SharedImages
from tests.framework.containerd import Containerd
from tests.framework.oci import MEDIA_INDEX, Index
from tests.framework.registry import Registry
from tests.framework.throttle import ThrottleProxy

MiB = 1024 * 1024


async def test_throttled_pull_shows_advancing_ingests(
        cri: CRIClient, ctd: ContainerdClient, containerd: Containerd,
        throttle: ThrottleProxy, big_image: RepoImage) -> None:
    throttle.set_rate(20 * MiB)
    ref = big_image.ref(throttle.host)
    layer_digests = {la.blob.digest for la in big_image.image.layers}
    offsets: dict[str, list[int]] = defaultdict(list)
    totals: dict[str, int] = {}
    lease_types: set[str] = set()

    start = time.monotonic()
    pull = asyncio.create_task(cri.pull_image(ref))
    while not pull.done():
        for st in await ctd.list_statuses():
            if st.kind == "layer" and st.digest in layer_digests:
                offsets[st.digest].append(st.offset)
                totals[st.digest] = st.total
                assert st.expected == ""  # as DESIGN.md says: parse the ref
                assert st.updated_at >= st.started_at > 0
        for lease in await ctd.list_leases():
            lease_types.update(r.type for r in await ctd.lease_resources(lease.id))
        await asyncio.wait({pull}, timeout=0.25)
    image_ref = await pull
    duration = time.monotonic() - start

    assert image_ref == big_image.image.config_digest
    print(f"pull of {big_image.image.download_size / MiB:.0f} MiB at 20 MiB/s: "
          f"{duration:.1f} s, {max(map(len, offsets.values()))} samples max per layer")
    assert duration >= 5.0, f"150 MB at 20 MiB/s took only {duration:.1f} s"
    assert len(offsets) >= 2, "expected several layers in flight"
    for digest, seen in offsets.items():
        layer = next(la for la in big_image.image.layers if la.blob.digest == digest)
        assert totals[digest] == layer.blob.size
        assert seen == sorted(seen), f"offset went backwards for {digest}"
    biggest = max(offsets.values(), key=len)
    assert len(set(biggest)) >= 3, f"offsets did not advance smoothly: {biggest}"
    assert "ingests" in lease_types or "content" in lease_types, lease_types
    # Finished: no ingest left, the image record and every layer are there.
    assert not [s for s in await ctd.list_statuses() if s.digest in layer_digests]
    rec = await ctd.get_image(ref)
    assert rec is not None and rec.target.digest == big_image.image.digest
    for la in big_image.image.layers:
        info = await ctd.content_info(la.blob.digest)
        assert info is not None and info.size == la.blob.size
    assert throttle.bytes_down >= 140 * MiB


async def test_lease_groups_pull_resources(
        cri: CRIClient, ctd: ContainerdClient, throttle: ThrottleProxy,
        shared_images: SharedImages) -> None:
    throttle.set_rate(4 * MiB)  # ~9 MiB: ~2 s, long enough to look at the lease
    before = {le.id for le in await ctd.list_leases()}
    pull = asyncio.create_task(cri.pull_image(shared_images.b.ref(throttle.host)))
    resources: dict[str, set[str]] = {}
    while not pull.done():
        for lease in await ctd.list_leases():
            if lease.id not in before:
                assert lease.created_at > 0
                res = await ctd.lease_resources(lease.id)
                resources.setdefault(lease.id, set()).update(f"{r.type}:{r.id}" for r in res)
        await asyncio.wait({pull}, timeout=0.2)
    await pull
    assert len(resources) == 1, resources  # one lease per pull
    held = next(iter(resources.values()))
    assert any(h.startswith("content:") for h in held) or any(
        h.startswith("ingests:") for h in held), held
    assert {le.id for le in await ctd.list_leases()} <= before | set(resources)
    assert await ctd.lease_resources("no-such-lease") == []


async def test_shared_base_layer_is_not_downloaded_twice(
        cri: CRIClient, ctd: ContainerdClient, containerd: Containerd,
        throttle: ThrottleProxy, shared_images: SharedImages) -> None:
    await cri.pull_image(shared_images.a.ref(throttle.host))
    after_a = throttle.bytes_down
    assert after_a >= shared_images.base.blob.size
    await cri.pull_image(shared_images.b.ref(throttle.host))
    second = throttle.bytes_down - after_a
    # b's own layer + manifest + config, not the 8 MiB base.
    assert second < shared_images.base.blob.size / 2, second
    own = shared_images.b.image.layers[1].blob.size
    assert second >= own
    base = await ctd.content_info(shared_images.base.blob.digest)
    assert base is not None
    assert base.labels["containerd.io/distribution.source.127.0.0.1"] in {
        "aggapi-test/shared-a", "aggapi-test/shared-a,aggapi-test/shared-b"}
    committed = {s.name: s for s in await ctd.list_snapshots(containerd.snapshotter)
                 if s.kind == "committed"}
    roots = [s for s in committed.values() if s.parent == ""
             and any(c.parent == s.name for c in committed.values())]
    # The base chain snapshot is the parent of both images' top snapshots.
    assert any(sum(c.parent == r.name for c in committed.values()) >= 2 for r in roots)


async def test_multiarch_index_resolves_host_platform(
        cri: CRIClient, ctd: ContainerdClient, registry: Registry,
        multiarch_image: tuple[str, Index]) -> None:
    ref, index = multiarch_image
    mine = index.for_platform("linux", ARCH)
    other = next(i for i in index.images if i is not mine)
    assert await cri.pull_image(ref) == mine.config_digest
    rec = await ctd.get_image(ref)
    assert rec is not None
    assert (rec.target.media_type, rec.target.digest) == (MEDIA_INDEX, index.digest)
    assert await ctd.content_info(mine.manifest.digest) is not None
    assert await ctd.content_info(mine.layers[0].blob.digest) is not None
    # Only the host platform's layer is fetched.
    assert await ctd.content_info(other.layers[0].blob.digest) is None
