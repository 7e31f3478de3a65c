"""Each containerd flavour the harness can run (tests.framework.containerdconfig) pulls
through the harness's throttle proxy, and shows a pull the way the progress engine
reads it: a lease with a gc.expire label holding ingests and content, ingest refs of the
form ``<kind>-sha256:<hex>``, the distribution-source label on the manifest, and an
active snapshot per layer being extracted. containerd 2.x is tried with the transfer
service and with ``use_local_image_pull``, whatever AGGAPI_CONTAINERD says.

Each test starts its own containerd (the session one stays untouched); 2.x is built by
hack/build-binaries.sh first if the cache lacks it (never skipped).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from tests.conftest import SharedImages
from tests.framework import containerdconfig
from tests.framework.containerd import Containerd
from tests.framework.containerdconfig import Flavor
from tests.framework.registry import Registry
from tests.framework.throttle import ThrottleProxy

MiB = 1 << 20
INGEST_REF = re.compile(r"^(layer|manifest|index|config)-sha256:[0-9a-f]{64}$")
FLAVORS = [Flavor(containerdconfig.V1_6, containerdconfig.LOCAL),
           Flavor(containerdconfig.V2, containerdconfig.TRANSFER),
           Flavor(containerdconfig.V2, containerdconfig.LOCAL)]


@dataclass
class Seen:
    """What polling containerd showed during one pull."""

    leases: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> labels
    resource_types: set[str] = field(default_factory=set)
    ingest_refs: set[str] = field(default_factory=set)
    active_snapshots: set[str] = field(default_factory=set)


@pytest.fixture(params=FLAVORS, ids=lambda f: f.label.replace(" ", "-"))
def flavored(request: pytest.FixtureRequest, runtime_deps: None, registry: Registry,
             pause_image: str) -> Iterator[tuple[Containerd, ThrottleProxy]]:
    flavor: Flavor = request.param
    containerdconfig.binaries(flavor)
    proxy = ThrottleProxy(registry.host)
    proxy.start()
    # A temp dir of its own (removed by stop()), not pytest's: socket paths < 108 bytes.
    ctd = Containerd(sandbox_image=pause_image, flavor=flavor)
    ctd.add_registry(registry.host)
    ctd.add_registry(proxy.host)  # the only route to the images pulled below
    try:
        ctd.start()
        yield ctd, proxy
    finally:
        ctd.stop()
        proxy.stop()


async def _watch(ctd: ContainerdClient, snapshotter: str, pull: asyncio.Task[str],
                 seen: Seen) -> None:
    while not pull.done():
        for st in await ctd.list_statuses():
            seen.ingest_refs.add(st.ref)
        for lease in await ctd.list_leases():
            seen.leases[lease.id] = lease.labels
            seen.resource_types.update(r.type for r in await ctd.lease_resources(lease.id))
        for snap in await ctd.list_snapshots(snapshotter):
            if snap.kind == "active":
                seen.active_snapshots.add(snap.name)
        await asyncio.wait({pull}, timeout=0.05)


async def test_pull_through_throttle_as_the_engine_reads_it(
        flavored: tuple[Containerd, ThrottleProxy], shared_images: SharedImages) -> None:
    containerd, proxy = flavored
    proxy.set_rate(4 * MiB)  # ~9 MiB: ~2 s, many polls
    image = shared_images.a
    ref = image.ref(proxy.host)
    seen = Seen()
    async with containerd.cri_client() as cri, containerd.containerd_client() as ctd:
        assert isinstance(cri, CRIClient)
        assert (await ctd.version()).startswith(containerd.flavor.version_prefix())
        pull = asyncio.create_task(cri.pull_image(ref))
        await _watch(ctd, containerd.snapshotter, pull, seen)
        assert await pull == image.image.config_digest
        rec = await ctd.get_image(ref)
        assert rec is not None and rec.target.digest == image.image.digest
        manifest = await ctd.content_info(image.image.digest)
        assert manifest is not None
        source_labels = {k: v for k, v in manifest.labels.items()
                         if k.startswith("containerd.io/distribution.source.")}
        leases_after = await ctd.list_leases()

    print(f"\n{containerd.flavor.label}: leases {seen.leases}; lease resources "
          f"{sorted(seen.resource_types)}; ingest refs "
          f"{sorted({r.split(':')[0] for r in seen.ingest_refs})}; active snapshots "
          f"{sorted(seen.active_snapshots)[:2]}...; manifest source labels {source_labels}")
    # The bytes came through the proxy: its hosts.toml was honoured on this pull path.
    assert proxy.bytes_down >= image.image.download_size
    layers = {la.blob.digest for la in image.image.layers}
    assert {r for r in seen.ingest_refs if r.startswith("layer-")} == \
        {f"layer-{d}" for d in layers}, seen.ingest_refs
    assert all(INGEST_REF.match(r) for r in seen.ingest_refs), seen.ingest_refs
    assert seen.leases, "no lease seen during the pull"
    assert all("containerd.io/gc.expire" in labels for labels in seen.leases.values())
    assert {"content", "ingests"} <= seen.resource_types, seen.resource_types
    # The engine's Extracting phase: an active snapshot while a layer unpacks (a 1 MiB
    # layer unpacks between two polls: at least one of them is seen).
    assert seen.active_snapshots, "no extract snapshot seen"
    assert all(re.match(r"^extract-\S+ sha256:[0-9a-f]{64}$", n)
               for n in seen.active_snapshots), seen.active_snapshots
    # The label names the host without its port (both lines, both pull paths).
    host = proxy.host.rsplit(":", 1)[0]
    assert source_labels == {
        f"containerd.io/distribution.source.{host}": image.repo.split(":")[0]}
    # The pull's lease is released once the image record exists.
    assert not set(seen.leases) & {le.id for le in leases_after}
