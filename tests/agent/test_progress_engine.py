"""The progress engine against a scripted in-memory containerd (tests/agent/fakectd.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from aggapi.agent.progress import view
from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.model import PHASE_ORDER, ImageState, NodeState
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.poller import ProgressPoller
from aggapi.auth.capability import ContainerRef
from aggapi.runtime.containerd import IngestStatus
from tests.agent.fakectd import OCI_INDEX, FakeContainerd, make_image, sha

REF = "127.0.0.1:5000/app:1"


def backend(fake: FakeContainerd) -> ContainerdBackend:
    return ContainerdBackend(fake, Platform("linux", "amd64"), clock=lambda: fake.now,
                             monotonic=lambda: fake.now)


async def test_a_pull_goes_through_the_phases_in_order() -> None:
    fake = FakeContainerd()
    img = make_image(REF, [1000, 2000], "app")
    be = backend(fake)
    seen: list[ImageState] = []

    async def look() -> ImageState:
        st = (await be.observe([REF])).images[REF]
        seen.append(st)
        return st

    assert (await look()).phase == "Waiting"
    fake.now += 1
    fake.start_pull(img, "L1")
    assert (await look()).phase == "Resolving"
    fake.fetch_manifest(img, "L1")
    st = await look()
    assert st.phase == "Downloading"
    assert [la.phase for la in st.layers] == ["Waiting", "Waiting"]
    assert st.total == 3000
    (d0, s0), (d1, s1) = img.layers
    fake.now += 1
    fake.download(d0, 500, s0, "L1")
    fake.download(d1, 0, s1, "L1")
    st = await look()
    assert (st.progress, st.total) == (500, 3000)
    fake.now += 1
    fake.download(d0, 1000, s0, "L1")
    fake.download(d1, 1000, s1, "L1")
    st = await look()
    # 500 -> 2000 bytes in the second since both ingests' first write (updated_at).
    assert st.bytes_per_second == 1500.0
    # Layer 0 is complete; layer 1 then has the whole link: 1000 bytes at 1500 B/s.
    assert st.eta_seconds == 0.7
    # Each layer has moved from its ingest's started_at (offset 0 then): 1000 bytes in
    # the second since, a rate of its own.
    assert [la.bytes_per_second for la in st.layers] == [1000.0, 1000.0]
    fake.commit(d0, s0, "L1")
    fake.extract(img.chains[0])
    st = await look()
    assert [la.phase for la in st.layers] == ["Extracting", "Downloading"]
    fake.now += 1
    fake.commit(d1, s1, "L1")
    fake.extract(img.chains[0], active=False)
    fake.extract(img.chains[1])
    st = await look()
    assert st.phase == "Extracting" and st.progress == st.total == 3000
    fake.extract(img.chains[1], active=False)
    fake.finish(img, "L1")
    st = await look()
    assert st.phase == "Done"
    assert [la.phase for la in st.layers] == ["Done", "Done"]

    ranks = [PHASE_ORDER[s.phase] for s in seen]
    assert ranks == sorted(ranks), [s.phase for s in seen]
    for i in range(2):
        prog = [s.layers[i].progress for s in seen if s.layers]
        assert prog == sorted(prog)
        assert all(s.layers[i].total == img.layers[i][1] for s in seen if s.layers)


async def test_a_layer_shared_with_a_present_image_is_already_present() -> None:
    fake = FakeContainerd()
    base = (sha(b"base"), 4000, sha(b"base-diff"))
    a = make_image("127.0.0.1:5000/a:1", [100], "a", shared=[base])
    b = make_image("127.0.0.1:5000/b:1", [200], "b", shared=[base])
    fake.start_pull(a, "LA")
    fake.fetch_manifest(a, "LA")
    for chain in a.chains:
        fake.extract(chain, active=False)
    fake.finish(a, "LA")
    fake.now += 100
    be = backend(fake)
    assert (await be.observe([b.name])).images[b.name].phase == "Waiting"
    fake.start_pull(b, "LB")
    fake.fetch_manifest(b, "LB")
    fake.download(b.layers[1][0], 50, 200, "LB")
    st = (await be.observe([b.name])).images[b.name]
    assert [la.phase for la in st.layers] == ["AlreadyPresent", "Downloading"]
    assert (st.progress, st.total) == (50, 200)  # the present base is not counted
    fake.commit(b.layers[1][0], 200, "LB")
    fake.extract(b.chains[1], active=False)
    fake.finish(b, "LB")
    st = (await be.observe([b.name])).images[b.name]
    assert st.phase == "Done"
    assert [la.phase for la in st.layers] == ["AlreadyPresent", "Done"]
    # A watcher arriving afterwards sees an image that was already there.
    st = (await backend(fake).observe([a.name])).images[a.name]
    assert st.phase == "AlreadyPresent"


async def test_lease_gone_without_image_is_failed_with_what_the_agent_knows() -> None:
    fake = FakeContainerd()
    img = make_image(REF, [1000], "app")
    be = backend(fake)
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1")
    fake.download(img.layers[0][0], 300, 1000, "L1")
    assert (await be.observe([REF])).images[REF].phase == "Downloading"
    fake.fail("L1")
    st = (await be.observe([REF])).images[REF]
    assert st.phase == "Failed"
    assert "lease L1" in st.error and "300 of 1000 bytes" in st.error
    assert fake.calls.count("Images.Get") == 1  # confirmed once before calling it Failed
    # kubelet retries: a new lease makes it a pull again.
    fake.start_pull(img, "L2")
    fake.fetch_manifest(img, "L2")
    assert (await be.observe([REF])).images[REF].phase == "Downloading"


async def test_pull_that_dies_while_resolving_is_failed() -> None:
    fake = FakeContainerd()
    img = make_image(REF, [1000], "app")
    be = backend(fake)
    fake.start_pull(img, "L1")
    assert (await be.observe([REF])).images[REF].phase == "Resolving"
    fake.fail("L1")
    st = (await be.observe([REF])).images[REF]
    assert st.phase == "Failed" and "before any manifest" in st.error


async def test_multi_arch_index_resolves_to_the_node_platform() -> None:
    fake = FakeContainerd()
    amd = make_image(REF, [111], "amd")
    arm = make_image(REF, [222], "arm")
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": arm.digest,
         "size": len(arm.manifest), "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd.digest,
         "size": len(amd.manifest), "platform": {"os": "linux", "architecture": "amd64"}},
    ]}).encode()
    be = backend(fake)
    fake.start_pull(amd, "L1")
    fake.put_blob(index, sha(index), len(index), {
        "containerd.io/distribution.source.127.0.0.1": "app",
        "containerd.io/gc.ref.content.m.0": amd.digest}, "L1")
    st = (await be.observe([REF])).images[REF]
    assert st.phase == "Resolving" and st.root_digest == sha(index)
    fake.fetch_manifest(amd, "L1")
    st = (await be.observe([REF])).images[REF]
    assert [(la.digest, la.total) for la in st.layers] == [(amd.layers[0][0], 111)]
    state = await be.observe([])
    assert state.pulls is not None and len(state.pulls) == 1
    assert state.pulls[0].root_digest == sha(index)
    assert state.pulls[0].repositories == ("127.0.0.1/app",)


async def test_source_label_set_after_classification_is_picked_up() -> None:
    """containerd labels a manifest's gc.refs before its distribution source; a
    poll in between must not leave the pull without repositories for good."""
    fake = FakeContainerd()
    img = make_image(REF, [100], "app")
    be = backend(fake)
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1", source_label=False)
    state = await be.observe([])
    assert state.pulls is not None and state.pulls[0].repositories == ()
    fake.label_source(img)
    state = await be.observe([])
    assert state.pulls is not None and state.pulls[0].repositories == ("127.0.0.1/app",)
    reads = fake.calls.count("Info")
    await be.observe([])
    assert fake.calls.count("Info") == reads  # labelled now: not read again


async def test_poller_calls_do_not_depend_on_subscribers() -> None:
    class Moving(FakeContainerd):
        async def list_statuses(self, filters: Sequence[str] = ()) -> list[IngestStatus]:
            for ref, st in self.statuses.items():  # the download advances every poll
                self.statuses[ref] = replace(st, offset=st.offset + 1)
            return await super().list_statuses(filters)

    async def calls_per_poll(n: int) -> float:
        fake = Moving()
        img = make_image(REF, [10_000], "app")
        fake.start_pull(img, "L1")
        fake.fetch_manifest(img, "L1")
        fake.download(img.layers[0][0], 10, 10_000, "L1")
        poller = ProgressPoller(backend(fake), interval=0.005)
        subs = [poller.subscribe([REF]) for _ in range(n)]
        await subs[0].next()
        # Read the counters when a poll has just published: between two polls.
        start_calls, start_polls = fake.rpc_count, poller.polls
        for _ in range(10):
            await subs[0].next()
        per_poll = (fake.rpc_count - start_calls) / (poller.polls - start_polls)
        for s in subs:
            s.close()
        assert not poller.running  # stops with the last subscriber
        return per_poll

    one, many = await calls_per_poll(1), await calls_per_poll(1000)
    # ListStatuses, Leases.List, Snapshots.List, Images.List; lease resources only on change.
    assert one == many == 4.0


async def test_an_image_removed_and_pulled_again_is_followed_afresh() -> None:
    """Pull, nobody watching, image removed (kubelet's GC), pulled again: the next
    watcher sees the new pull, not the old one's lease gone without an image."""
    fake = FakeContainerd()
    img = make_image(REF, [1000], "app")
    poller = ProgressPoller(backend(fake), interval=0.005)
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1")
    fake.download(img.layers[0][0], 100, 1000, "L1")
    async with poller.subscribe([REF]) as sub:
        st = await sub.next()
        assert st is not None and st.images[REF].phase == "Downloading"
    fake.commit(img.layers[0][0], 1000, "L1")
    fake.finish(img, "L1")
    del fake.images[img.name]  # removed while nobody watched
    fake.now += 10
    fake.start_pull(img, "L2")
    async with poller.subscribe([REF]) as sub:
        st = await sub.next()
        assert st is not None
        assert st.images[REF].phase in ("Waiting", "Resolving", "Downloading"), st.images[REF]
        fake.fetch_manifest(img, "L2")
        fake.download(img.layers[0][0], 500, 1000, "L2")
        while st.images[REF].progress != 500:
            st = await sub.next()
            assert st is not None
            assert st.images[REF].phase != "Failed", st.images[REF]
    await poller.close()


async def test_slow_subscriber_gets_latest_state_only() -> None:
    fake = FakeContainerd()
    img = make_image(REF, [10_000], "app")
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1")
    poller = ProgressPoller(backend(fake), interval=0.005)
    fast, slow = poller.subscribe([REF]), poller.subscribe([REF])
    first = await slow.next()
    assert first is not None
    states: list[NodeState] = []
    for off in range(1, 6):
        fake.download(img.layers[0][0], off * 1000, 10_000, "L1")
        while True:
            st = await fast.next()
            assert st is not None
            if st.images[REF].progress == off * 1000:
                states.append(st)
                break
    latest = await slow.next()
    assert latest is not None and latest.images[REF].progress == 5000  # skipped 1000..4000
    assert await slow.next(max_wait=0.05) is None  # nothing newer: no backlog
    fast.close()
    slow.close()
    await poller.close()


async def test_parallel_layers_each_get_their_own_rate_and_eta() -> None:
    """Three layers downloading at once at different rates: each layer's bytesPerSecond
    and ETA come from its own byte history, not the image's (issue 14: a layer once
    showed the whole pull's rate and an ETA three times too short)."""
    fake = FakeContainerd()
    sizes = [120_000, 120_000, 120_000]
    rates = [1_000, 3_000, 9_000]  # bytes per (fake) second
    img = make_image(REF, sizes, "par")
    be = backend(fake)
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1")
    for step in range(6):
        for (digest, size), r in zip(img.layers, rates, strict=True):
            fake.download(digest, step * r, size, "L1")
        st = (await be.observe([REF])).images[REF]
        fake.now += 1
    assert [la.progress for la in st.layers] == [5 * r for r in rates]
    assert [la.bytes_per_second for la in st.layers] == [float(r) for r in rates]
    # They share one 13 kB/s link: when the fastest finishes its share goes to the
    # others (work conservation), so the slower ones finish sooner than left/rate.
    left = [float(s - 5 * r) for s, r in zip(sizes, rates, strict=True)]
    t2 = left[2] / rates[2]
    left0, left1 = left[0] - t2 * rates[0], left[1] - t2 * rates[1]
    t1 = t2 + left1 / (sum(rates) * 3 / 4)
    t0 = t1 + (left0 - (t1 - t2) * sum(rates) / 4) / sum(rates)
    assert [la.eta_seconds for la in st.layers] == [round(t, 1) for t in (t0, t1, t2)]
    assert st.eta_seconds == round(t0, 1)
    # The image's rate is the rate of its bytes: here the three together.
    assert st.bytes_per_second == float(sum(rates))


async def test_a_re_pull_of_a_moved_tag_is_followed() -> None:
    """imagePullPolicy: Always, and the tag now names another image: the record of the
    old one exists while kubelet pulls the new one. The stream follows that pull
    (it said AlreadyPresent and ended at 622964a) and ends Done with the new digest."""
    fake = FakeContainerd()
    old = make_image(REF, [1000], "old")
    new = make_image(REF, [3000], "new", shared=[(old.layers[0][0], 1000, old.diff_ids[0])])
    fake.start_pull(old, "L1")
    fake.fetch_manifest(old, "L1")
    fake.commit(old.layers[0][0], 1000, "L1")
    fake.extract(old.chains[0], active=False)
    fake.finish(old, "L1")
    be = backend(fake)
    st = (await be.observe([REF])).images[REF]
    assert st.phase == "AlreadyPresent" and st.root_digest == old.digest
    fake.now += 5
    fake.start_pull(new, "L2")
    st = (await be.observe([REF])).images[REF]
    assert st.phase == "AlreadyPresent"  # an empty lease names no image yet
    fake.fetch_manifest(new, "L2")
    d, size = new.layers[1]
    fake.now += 1
    fake.download(d, 1000, size, "L2")
    state = await be.observe([REF])
    st = state.images[REF]
    assert (st.phase, st.root_digest, st.lease) == ("Downloading", new.digest, "L2")
    # each layer object names its manifest: the apiserver drops the old image's layers
    objs = view.objects([ContainerRef("c", REF)], state, "layer")
    assert {(o["layer"], o["manifest"]) for o in objs} == {
        (old.layers[0][0], new.digest), (d, new.digest)}
    assert [la.phase for la in st.layers] == ["AlreadyPresent", "Downloading"]
    assert (st.progress, st.total) == (1000, 3000)
    fake.now += 1
    fake.commit(d, size, "L2")
    fake.extract(new.chains[1], active=False)
    fake.finish(new, "L2")
    st = (await be.observe([REF])).images[REF]
    assert (st.phase, st.root_digest) == ("Done", new.digest)
    assert [la.phase for la in st.layers] == ["AlreadyPresent", "Done"]


async def test_a_finished_pull_whose_lease_lingers_is_present() -> None:
    """containerd writes the record before it drops the pull's lease: in between, the
    image is present, not still pulling."""
    fake = FakeContainerd()
    img = make_image(REF, [1000], "app")
    be = backend(fake)
    fake.start_pull(img, "L1")
    fake.fetch_manifest(img, "L1")
    fake.download(img.layers[0][0], 500, 1000, "L1")
    assert (await be.observe([REF])).images[REF].phase == "Downloading"
    fake.now += 1
    fake.commit(img.layers[0][0], 1000, "L1")
    fake.extract(img.chains[0], active=False)
    lease = fake.leases["L1"]
    fake.finish(img, "L1")
    fake.leases["L1"] = lease  # not dropped yet
    assert (await be.observe([REF])).images[REF].phase == "Done"
