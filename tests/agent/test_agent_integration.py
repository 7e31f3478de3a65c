"""The agent against real containerd + runc, a registry and a throttling proxy
(fixtures from tests/conftest.py). Pulls go through CRI PullImage, as kubelet's
do; progress is read over the agent's real HTTPS API."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggapi.agent.progress.model import PHASE_ORDER
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeCallError
from tests.agent.agentserver import Agent, client_ssl, pki, run_agent
from tests.framework.containerd import Containerd
from tests.framework.throttle import ThrottleProxy

RATE = 10 * 1024 * 1024  # bytes/s through the proxy: ~150 MB take ~15 s
STEP = 1 << 20  # containerd 2.x moves an ingest's offset in 1 MiB steps


@pytest.fixture
async def agent(tmp_path: Path, cri: CRIClient, ctd: ContainerdClient,
                containerd: Containerd) -> Any:
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd,
                         snapshotter=containerd.snapshotter) as a:
        yield a


async def collect(agent: Agent, ref: str, pull: Any, **params: str) -> list[dict[str, Any]]:
    """Subscribe, start ``pull`` once the stream is open, read until it ends."""
    out: list[dict[str, Any]] = []
    task: asyncio.Task[Any] | None = None
    async for obj in agent.stream(agent.token(images=[ref]), **params):
        out.append(obj)
        if task is None:
            task = asyncio.create_task(pull)
    assert task is not None
    try:
        await task
    except RuntimeCallError:
        pass
    return out


def check_layer_stream(objs: list[dict[str, Any]], sizes: dict[str, int]) -> None:
    by_layer: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        if o["kind"] == "Progress" and o["layer"]:
            by_layer.setdefault(o["layer"], []).append(o)
    assert set(by_layer) == set(sizes)
    for digest, seq in by_layer.items():
        progress = [o["progress"] for o in seq]
        assert progress == sorted(progress), f"{digest} went backwards: {progress}"
        assert {o["total"] for o in seq} == {sizes[digest]}
        ranks = [PHASE_ORDER[o["phase"]] for o in seq]
        assert ranks == sorted(ranks), [o["phase"] for o in seq]


async def test_throttled_pull_streams_layer_progress(
        agent: Agent, cri: CRIClient, throttle: ThrottleProxy, big_image: Any,
        busybox_image: str) -> None:
    await cri.pull_image(busybox_image)  # big's base layer is busybox's: AlreadyPresent
    throttle.set_rate(RATE)
    ref = big_image.ref(throttle.host)
    sizes = {la.blob.digest: la.blob.size for la in big_image.image.layers}
    layer_task = asyncio.create_task(collect(agent, ref, asyncio.sleep(0)))
    wire: list[tuple[float, int]] = []

    async def sample_wire() -> None:
        while True:
            wire.append((time.monotonic(), throttle.bytes_down))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample_wire())
    objs = await collect(agent, ref, cri.pull_image(ref), granularity="image")
    sampler.cancel()
    layer_objs = await layer_task
    # What actually crossed the proxy over the middle half of the transfer.
    moving = [w for a, w in itertools.pairwise(wire) if w[1] > a[1]]
    (t0, b0), (t1, b1) = moving[len(moving) // 4], moving[-len(moving) // 4]
    wire_rate = (b1 - b0) / (t1 - t0)

    assert objs[-1]["kind"] == "Summary" and objs[-1]["phase"] == "Done", objs[-1]
    phases = [o["phase"] for o in objs if o["kind"] == "Progress"]
    assert phases[-1] == "Done"
    ranks = [PHASE_ORDER[p] for p in phases]
    assert ranks == sorted(ranks), phases
    assert "Downloading" in phases
    base = big_image.image.layers[0].blob.digest
    need = sum(s for d, s in sizes.items() if d != base)
    assert objs[-2]["progress"] == objs[-2]["total"] == need
    rates = [o["bytesPerSecond"] for o in objs
             if o["kind"] == "Progress" and o["phase"] == "Downloading" and o["bytesPerSecond"]]
    assert len(rates) >= 5, rates
    mid = statistics.median(rates[len(rates) // 4: -max(len(rates) // 4, 1)])
    print(f"throttle set to {RATE} B/s; wire {wire_rate:.0f} B/s; agent said {mid:.0f} B/s")
    # Against the throttle's configured rate (the bar) and what crossed the wire.
    assert 0.7 * RATE <= mid <= 1.3 * RATE, (mid, RATE, rates)
    assert 0.7 * wire_rate <= mid <= 1.3 * wire_rate, (mid, wire_rate, rates)

    check_layer_stream(layer_objs, sizes)
    last = {o["layer"]: o["phase"] for o in layer_objs if o["kind"] == "Progress"}
    assert last[base] == "AlreadyPresent"
    assert {last[d] for d in sizes if d != base} == {"Done"}


async def test_shared_base_layer_is_already_present(agent: Agent, cri: CRIClient,
                                                    registry: Any, shared_images: Any) -> None:
    await cri.pull_image(shared_images.a.ref(registry.host))
    ref = shared_images.b.ref(registry.host)
    objs = await collect(agent, ref, cri.pull_image(ref))
    assert objs[-1]["kind"] == "Summary"
    last = {o["layer"]: o for o in objs if o["kind"] == "Progress"}
    assert last[shared_images.base.blob.digest]["phase"] == "AlreadyPresent"
    own = shared_images.b.image.layers[1].blob
    assert last[own.digest]["phase"] == "Done"
    assert last[own.digest]["progress"] == last[own.digest]["total"] == own.size


async def test_multi_arch_index_reports_the_node_platform(agent: Agent, cri: CRIClient,
                                                          multiarch_image: Any) -> None:
    ref, index = multiarch_image
    objs = await collect(agent, ref, cri.pull_image(ref))
    amd = index.for_platform("linux", "amd64")
    layers = {o["layer"] for o in objs if o["kind"] == "Progress" and o["layer"]}
    assert layers == {la.blob.digest for la in amd.layers}
    assert objs[-1]["kind"] == "Summary" and objs[-1]["phase"] == "Done"


async def test_registry_down_mid_pull_is_failed(agent: Agent, cri: CRIClient,
                                                throttle: ThrottleProxy, big_image: Any) -> None:
    throttle.set_rate(RATE)
    ref = big_image.ref(throttle.host)
    seen_downloading = asyncio.Event()
    out: list[dict[str, Any]] = []

    async def watch() -> None:
        async for obj in agent.stream(agent.token(images=[ref]), granularity="image"):
            out.append(obj)
            if obj.get("phase") == "Downloading" and obj.get("progress", 0) > 10 << 20:
                seen_downloading.set()

    watcher = asyncio.create_task(watch())
    puller = asyncio.create_task(cri.pull_image(ref))
    await asyncio.wait_for(seen_downloading.wait(), 30)
    throttle.kill()
    with pytest.raises(RuntimeCallError) as err:
        await puller
    await asyncio.wait_for(watcher, 30)
    assert out[-1]["kind"] == "Error" and out[-1]["phase"] == "Failed", out[-1]
    assert "without an image record" in out[-1]["error"]
    print("CRI said:", err.value, "| agent said:", out[-1]["error"])


async def test_node_view_lists_in_flight_pull_and_kubelet_limits(
        tmp_path: Path, cri: CRIClient, ctd: ContainerdClient, throttle: ThrottleProxy,
        big_image: Any, containerd: Containerd) -> None:
    kcfg = tmp_path / "kubelet.yaml"
    kcfg.write_text("kind: KubeletConfiguration\nserializeImagePulls: false\n"
                    "maxParallelImagePulls: 2\n")
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd,
                         kubelet_config=str(kcfg), snapshotter=containerd.snapshotter) as agent:
        throttle.set_rate(RATE)
        ref = big_image.ref(throttle.host)
        puller = asyncio.create_task(cri.pull_image(ref))
        body: dict[str, Any] = {}
        for _ in range(40):
            await asyncio.sleep(0.25)
            async with agent.get("/v1/imagepulls", agent.token("imagepulls")) as resp:
                assert resp.status == 200
                body = await resp.json()
            if body["pulls"] and body["pulls"][0]["progress"] > 0:
                break
        throttle.set_rate(None)
        await puller
    assert body["kubelet"]["serializeImagePulls"] is False
    assert body["kubelet"]["maxParallelImagePulls"] == 2
    assert body["inFlight"] == 1 and body["slotsFree"] == 1
    pull = body["pulls"][0]
    assert pull["phase"] == "Downloading"
    assert pull["repositories"] == ["127.0.0.1/aggapi-test/big"]


async def test_parallel_layers_report_their_own_rate_and_eta(
        agent: Agent, cri: CRIClient, throttle: ThrottleProxy, big_image: Any,
        busybox_image: str) -> None:
    """Three layers downloading at once, each throttled to its own rate (the proxy
    paces each blob's answer separately): the agent's per-layer rate follows each
    layer's throttle. No link is shared here: the engine assumes one until the first
    layer finishes and the others do not speed up (aggapi/agent/progress/eta.py,
    Sharing); from a second after that, each layer's ETA predicts when it really
    finished (within 30% + 0.5 s)."""
    await cri.pull_image(busybox_image)  # the base layer is busybox's: AlreadyPresent
    layers = [la.blob for la in big_image.image.layers[1:]]
    # Sized so that each layer takes 8-12 s alone: the slowest is the smallest.
    seconds = {layers[0].digest: 8.0, layers[1].digest: 10.0, layers[2].digest: 12.0}
    rates = {la.digest: la.size / seconds[la.digest] for la in layers}
    throttle.set_blob_rates(dict(rates))
    try:
        ref = big_image.ref(throttle.host)
        t0 = time.monotonic()
        stamped: list[tuple[float, dict[str, Any]]] = []
        task: asyncio.Task[Any] | None = None
        async for obj in agent.stream(agent.token(images=[ref])):
            stamped.append((time.monotonic() - t0, obj))
            if task is None:
                task = asyncio.create_task(cri.pull_image(ref))
        assert task is not None
        await task
    finally:
        throttle.set_blob_rates({})
    assert stamped[-1][1]["kind"] == "Summary", stamped[-1]
    reported: dict[str, float] = {}
    seqs = {la.digest: [(t, o) for t, o in stamped
                        if o["kind"] == "Progress" and o["layer"] == la.digest]
            for la in layers}
    done_at = {la.digest: next(t for t, o in seqs[la.digest] if o["progress"] >= la.size)
               for la in layers}
    first_done = min(done_at.values())
    for la in layers:
        seq, finished = seqs[la.digest], done_at[la.digest]
        mid = [(t, o) for t, o in seq if o["phase"] == "Downloading" and o["etaSeconds"]
               and 0.4 * la.size <= o["progress"] <= 0.6 * la.size]
        assert mid, (la.digest, seq)
        t_mid, o_mid = mid[len(mid) // 2]
        print(f"layer {la.digest[:19]} throttle {rates[la.digest]:.0f} B/s: said "
              f"{o_mid['bytesPerSecond']:.0f} B/s, ETA {o_mid['etaSeconds']:.1f} s at "
              f"{o_mid['progress'] / la.size:.0%}; finished {finished - t_mid:.1f} s later")
        late = [(t, o) for t, o in seq if o["phase"] == "Downloading"
                and o["etaSeconds"] is not None and o["progress"] < la.size
                and t >= first_done + 1.0]
        if late:
            t_late, o_late = late[len(late) // 2]
            left = finished - t_late
            print(f"  {t_late - first_done:.1f} s after the first finished: ETA "
                  f"{o_late['etaSeconds']:.1f} s, finished {left:.1f} s later")
            assert abs(o_late["etaSeconds"] - left) <= 0.3 * left + 0.5, (o_late, left)
        reported[la.digest] = statistics.median(o["bytesPerSecond"] for _, o in mid)
        assert 0.5 * rates[la.digest] <= reported[la.digest] <= 1.5 * rates[la.digest], \
            (reported[la.digest], rates[la.digest])
    by_throttle = sorted(rates, key=rates.__getitem__)
    assert sorted(reported, key=reported.__getitem__) == by_throttle, (reported, rates)


STEPS = 16  # offset steps test_ingest_updated_at_dates_each_offset_step checks


async def test_ingest_updated_at_dates_each_offset_step(
        cri: CRIClient, ctd: ContainerdClient, throttle: ThrottleProxy,
        big_image: Any) -> None:
    """What the step-aware rates rely on (aggapi/agent/progress/rate.py): an ingest's
    updated_at is when its offset last moved (its data file's mtime), so it dates each
    step better than the poll that sees it. Polled every 50 ms during a throttled pull:
    updated_at changes with the offset, never after the poll that saw it, and within a
    poll interval (plus the gRPC round trip) before it."""
    throttle.set_rate(2 * 1024 * 1024)
    ref = big_image.ref(throttle.host)
    puller = asyncio.create_task(cri.pull_image(ref))
    seen: dict[str, list[tuple[float, int, float]]] = {}  # ref -> (poll time, offset, upd)
    try:
        # STEPS offset steps are plenty (~8 s at 2 MiB/s and 1 MiB steps); 20 s at most.
        deadline = time.time() + 20
        while not puller.done() and time.time() < deadline \
                and sum(len(h) - 1 for h in seen.values()) < STEPS:
            before = time.time()
            statuses = await ctd.list_statuses()
            after = time.time()
            for s in statuses:
                if s.kind == "layer":
                    hist = seen.setdefault(s.ref, [])
                    if not hist or hist[-1][1] != s.offset:
                        hist.append((before, s.offset, s.updated_at))
                        assert s.updated_at <= after + 0.01, (s, after)
            await asyncio.sleep(0.05)
    finally:
        throttle.set_rate(None)
        await puller
    assert sum(len(h) - 1 for h in seen.values()) >= 5, seen
    for r, hist in seen.items():
        for (p0, _, u0), (_, _, u1) in itertools.pairwise(hist):
            assert u1 > u0, (r, hist)  # a new offset, a new update time
            assert u1 >= p0 - 0.25, (r, hist)  # it happened after the previous poll
    # What offsets move by on this runtime (1 MiB on containerd 2.x's transfer service).
    deltas = sorted({o1 - o0 for hist in seen.values()
                     for (_, o0, _), (_, o1, _) in itertools.pairwise(hist)})
    print("offset steps seen:", deltas[:5], "...", deltas[-3:])


async def test_a_re_pull_of_a_moved_tag_is_followed(
        agent: Agent, cri: CRIClient, throttle: ThrottleProxy, registry: Any,
        oci_cache: Any) -> None:
    """imagePullPolicy: Always of a tag pushed again with another image: the old
    record exists while CRI pulls the new one. A stream opened during that pull shows
    it (Downloading, the new digest) and ends Done; at 622964a it said AlreadyPresent
    and ended at once."""
    from tests.framework import oci
    repo = "aggapi-test/moving"
    v1 = oci.build_image([oci_cache.random_layer(1 << 20, seed="moving-1")],
                         labels={"io.aggapi.test": "moving-1"})
    v2 = oci.build_image([oci_cache.random_layer(8 << 20, seed="moving-2")],
                         labels={"io.aggapi.test": "moving-2"})
    oci.push_image(registry.host, repo, v1, "1")
    ref = f"{throttle.host}/{repo}:1"
    await cri.pull_image(ref)
    oci.push_image(registry.host, repo, v2, "1")  # the tag moves
    throttle.set_rate(1024 * 1024)  # 8 s for the new layer
    repull = asyncio.create_task(cri.pull_image(ref))
    try:
        await asyncio.sleep(1.5)  # kubelet is pulling when the user looks
        objs = [o async for o in agent.stream(agent.token(images=[ref]), granularity="image")]
        await repull
    finally:
        throttle.set_rate(None)
    phases = [o["phase"] for o in objs if o["kind"] == "Progress"]
    assert "Downloading" in phases and "AlreadyPresent" not in phases, phases
    assert objs[-1]["kind"] == "Summary" and objs[-1]["phase"] == "Done", objs[-1]


async def test_pull_metrics_agree_with_the_stream(
        tmp_path: Path, cri: CRIClient, ctd: ContainerdClient, throttle: ThrottleProxy,
        big_image: Any, containerd: Containerd) -> None:
    """A throttled pull through real containerd, scraped as Prometheus does, beside its
    progress stream: the bytes counter within one containerd step (1 MiB) of the
    stream's progress, exactly one pull in flight for the registry, then its duration
    and size once it ends."""
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd, metrics_auth="none",
                         snapshotter=containerd.snapshotter) as agent:
        throttle.set_rate(RATE)
        ref = big_image.ref(throttle.host)
        # containerd's distribution-source labels name the host without its port.
        registry = throttle.host.rpartition(":")[0]
        compared, total = 0, 0
        task: asyncio.Task[Any] | None = None
        async for obj in agent.stream(agent.token(images=[ref]), granularity="image"):
            if task is None:
                task = asyncio.create_task(cri.pull_image(ref))
            if obj["kind"] != "Progress":
                continue
            total = obj["total"] or total
            if obj["phase"] != "Downloading" or not obj["progress"]:
                continue
            text = await scrape_metrics(agent)
            got = sample(text, "aggapi_agent_image_pull_bytes_total", registry)
            assert sample(text, "aggapi_agent_image_pulls_in_flight", registry) == 1
            # The stream and the scrape read polls apart: at most a few steps between.
            assert abs(got - obj["progress"]) <= 3 * STEP, (got, obj["progress"])
            compared += 1
        assert task is not None
        await task
        assert compared >= 3
        text = await scrape_metrics(agent)
        for _ in range(40):  # the lease ends just after the image record lands
            if sample(text, "aggapi_agent_image_pull_duration_seconds_count", registry):
                break
            await asyncio.sleep(0.25)
            text = await scrape_metrics(agent)
    assert sample(text, "aggapi_agent_image_pull_duration_seconds_count", registry) == 1
    assert sample(text, "aggapi_agent_image_pulls_in_flight", registry) == 0
    assert total > 100 * STEP
    assert sample(text, "aggapi_agent_image_pull_bytes_total", registry) == total
    assert sample(text, "aggapi_agent_image_pull_size_bytes_sum", registry) == total


async def scrape_metrics(agent: Agent) -> str:
    async with aiohttp.ClientSession() as s, s.get(
            agent.metrics_url + "/metrics",
            ssl=client_ssl(agent.pki, cert=False)) as resp:
        assert resp.status == 200
        return await resp.text()


def sample(text: str, name: str, registry: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("registry") == registry:
                return float(s.value)
    return 0.0
