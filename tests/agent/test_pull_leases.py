"""Which containerd leases are pulls: kubelet's, not other clients' or leftovers."""

from __future__ import annotations

from aggapi.runtime.containerd import Lease, LeaseResource
from tests.agent.fakectd import FakeContainerd, make_image, sha
from tests.agent.test_progress_engine import REF, backend


async def test_only_pull_leases_count_as_pulls() -> None:
    """Other clients' leases (a snapshot being built, a gc hold on a blob) are no kubelet
    pull; an empty lease is a pull resolving its tag, for a while."""
    fake = FakeContainerd()
    img = make_image(REF, [1000], "app")
    be = backend(fake)
    fake.start_pull(img, "pull")
    fake.fetch_manifest(img, "pull")
    fake.leases["build"] = (Lease("build", fake.now, {}),
                            [LeaseResource("snap-1", "snapshots/overlayfs")])
    fake.put_blob(b"x", sha(b"x"), 1)
    fake.leases["hold"] = (Lease("hold", fake.now, {}), [LeaseResource(sha(b"x"), "content")])
    fake.leases["resolving"] = (Lease("resolving", fake.now, {}), [])
    state = await be.observe([])
    assert state.pulls is not None
    assert sorted(p.lease for p in state.pulls) == ["pull", "resolving"]
    fake.now += 31  # an empty lease that old is no pull resolving its tag
    state = await be.observe([])
    assert state.pulls is not None and [p.lease for p in state.pulls] == ["pull"]


async def test_an_imported_images_leftover_lease_is_no_pull() -> None:
    """``ctr import`` (how the harness loads images, and how admins side-load them)
    leaves a lease with manifests from no registry, expiring after 24 h. It was counted
    as a pull for good (registry "unknown"), stalled: AggapiImagePullStalled fired on
    both nodes of the Prometheus e2e (session 37). A manifest not yet labelled with its
    source is a pull only in the moment before containerd labels it."""
    fake = FakeContainerd()
    img = make_image(REF, [100], "app")
    be = backend(fake)
    fake.start_pull(img, "import")
    fake.fetch_manifest(img, "import", source_label=False)
    fake.commit(img.layers[0][0], 100, "import")
    state = await be.observe([])
    assert state.pulls is not None and [p.lease for p in state.pulls] == ["import"]
    fake.now += 31
    state = await be.observe([])
    assert state.pulls is not None and not state.pulls
