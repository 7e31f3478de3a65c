"""pods/imagepullprogress end to end: front proxy -> apiserver -> real agent -> real
containerd, with Kubernetes state from the fake kube-apiserver and pulls through CRI."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent import app as agent_app
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.progress.model import PHASE_ORDER
from aggapi.apiserver.imagepullprogress.handler import PodProgressHandler
from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeCallError
from tests.agent.agentserver import NODE, run_agent
from tests.framework.throttle import ThrottleProxy

from .conftest import Stack, endpoint_slice, pod_object

RATE = 20 << 20


def progress(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == "Progress"]


async def test_pull_streamed_from_start_to_summary(
        stack: Stack, cri: CRIClient, throttle: ThrottleProxy, big_image: Any,
        busybox_image: str) -> None:
    await cri.pull_image(busybox_image)  # big's base layer: AlreadyPresent
    throttle.set_rate(RATE)
    ref = big_image.ref(throttle.host)
    stack.kube.put("api/v1", "pods", pod_object("big", [("app", ref)]))
    watch = asyncio.create_task(stack.lines(stack.pod_path("big", "imagepullprogress",
                                                           watch=True)))
    await asyncio.sleep(1.0)  # the stream is up before the first byte moves
    await cri.pull_image(ref)
    code, objs = await asyncio.wait_for(watch, 120)
    assert code == 200
    assert objs[-1]["kind"] == "Summary" and objs[-1]["phase"] == "Done", objs[-1]
    sizes = {la.blob.digest: la.blob.size for la in big_image.image.layers}
    by_layer: dict[str, list[dict[str, Any]]] = {}
    for o in progress(objs):
        assert o["container"] == "app" and o["image"] == ref
        by_layer.setdefault(o["layer"], []).append(o)
    # Until the manifest is known there are no layers: image-level objects only
    # (no kubelet here, so no Pulling event: what has no bytes yet is Pending); that
    # row ends with the image.
    rows = [o["phase"] for o in by_layer.pop("", [])]
    assert set(rows[:-1]) <= {"Pending", "Resolving"} and rows[-1] == "Done", rows
    assert set(by_layer) == set(sizes)
    for digest, seq in by_layer.items():
        offsets = [o["progress"] for o in seq]
        assert offsets == sorted(offsets), (digest, offsets)
        assert {o["total"] for o in seq} == {sizes[digest]}
        ranks = [PHASE_ORDER["Waiting" if o["phase"] == "Pending" else o["phase"]]
                 for o in seq]
        assert ranks == sorted(ranks), [o["phase"] for o in seq]
    base = big_image.image.layers[0].blob.digest
    assert by_layer[base][-1]["phase"] == "AlreadyPresent"
    downloading = [o for o in progress(objs) if o["phase"] == "Downloading"]
    assert len(downloading) >= 5  # watched live, not just the end state


async def test_follow_false_returns_current_state_and_ends(
        stack: Stack, cri: CRIClient, busybox_image: str) -> None:
    await cri.pull_image(busybox_image)
    stack.kube.put("api/v1", "pods", pod_object("p", [("app", busybox_image)]))
    t0 = time.monotonic()
    code, objs = await stack.lines(stack.pod_path("p", "imagepullprogress"), follow="false")
    assert code == 200 and time.monotonic() - t0 < 10
    assert objs[-1]["kind"] == "Summary"
    assert {o["phase"] for o in progress(objs)} <= {"Done", "AlreadyPresent"}


@pytest.mark.parametrize("granularity", ["layer", "image", "pod"])
async def test_every_granularity(stack: Stack, cri: CRIClient, busybox_image: str,
                                 granularity: str) -> None:
    await cri.pull_image(busybox_image)
    stack.kube.put("api/v1", "pods", pod_object("p", [("app", busybox_image)]))
    code, objs = await stack.lines(stack.pod_path("p", "imagepullprogress"),
                                   follow="false", granularity=granularity)
    assert code == 200
    prog = progress(objs)
    assert prog
    if granularity == "layer":
        assert all(o["layer"].startswith("sha256:") for o in prog)
    elif granularity == "image":
        assert [(o["container"], o["layer"]) for o in prog] == [("app", "")]
    else:
        assert len(prog) == 1 and prog[0]["container"] == "" and prog[0]["image"] == ""


async def test_container_filter(stack: Stack, cri: CRIClient, busybox_image: str,
                                noshell_image: str) -> None:
    for img in (busybox_image, noshell_image):
        await cri.pull_image(img)
    stack.kube.put("api/v1", "pods", pod_object(
        "two", [("a", busybox_image), ("b", noshell_image)]))
    path = stack.pod_path("two", "imagepullprogress")
    code, objs = await stack.lines(path, follow="false", granularity="image", container="b")
    assert code == 200
    assert {(o["container"], o["image"]) for o in progress(objs)} == {("b", noshell_image)}
    code, objs = await stack.lines(path, follow="false", container="nope")
    assert code == 400 and objs[0]["kind"] == "Status"
    assert "nope" in objs[0]["message"]


async def test_pod_not_found_is_404(stack: Stack) -> None:
    code, objs = await stack.lines(stack.pod_path("ghost", "imagepullprogress"))
    assert code == 404
    assert objs[0]["kind"] == "Status" and objs[0]["reason"] == "NotFound"


async def test_unscheduled_then_scheduled(stack: Stack, cri: CRIClient,
                                          busybox_image: str) -> None:
    pod = pod_object("later", [("app", busybox_image)], node="")
    stack.kube.put("api/v1", "pods", pod)
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async with stack.session().get(stack.pod_path("later", "imagepullprogress",
                                                      watch=True)) as resp:
            assert resp.status == 200
            async for line in resp.content:
                seen.append(json.loads(line))

    reader = asyncio.create_task(read())
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.05)
    assert seen and seen[0]["phase"] == "Unscheduled"
    pod["spec"]["nodeName"] = NODE
    stack.kube.put("api/v1", "pods", pod)
    await cri.pull_image(busybox_image)
    await asyncio.wait_for(reader, 60)
    assert seen[-1]["kind"] == "Summary"
    assert [o["phase"] for o in seen][:1] == ["Unscheduled"]


async def test_no_agent_on_the_node_is_503(stack: Stack, busybox_image: str) -> None:
    stack.kube.put("api/v1", "pods", pod_object("elsewhere", [("app", busybox_image)],
                                                node="node-without-agent"))
    async with stack.session().get(stack.pod_path("elsewhere", "imagepullprogress")) as resp:
        assert resp.status == 503
        assert resp.headers.get("Retry-After")
        body = await resp.json()
        assert body["kind"] == "Status" and "node-without-agent" in body["message"]


async def test_agent_killed_mid_stream_then_reconnect(
        stack: Stack, tmp_path: Path, cri: CRIClient, containerd: Any,
        throttle: ThrottleProxy, big_image: Any) -> None:
    """An agent process serving the node is SIGKILLed mid-pull: the stream ends with a
    clear error object; the client's retry reaches the agent that replaced it."""
    ref = big_image.ref(throttle.host)
    stack.kube.put("api/v1", "pods", pod_object("k", [("app", ref)]))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aggapi", "agent", "--node-name", NODE,
        "--certs-dir", str(stack.agent.pki), "--bind-address=127.0.0.1", f"--secure-port={port}",
        "--cri-address", containerd.address, "--containerd-address", containerd.address,
        "--kubelet-config", "/nonexistent", "--copy-state-dir", str(tmp_path / "inflight2"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_port(port)
        stack.kube.put("apis/discovery.k8s.io/v1", "endpointslices", endpoint_slice(port))
        await asyncio.sleep(0.5)  # the apiserver's EndpointSlice watch catches up
        throttle.set_rate(RATE)
        pull = asyncio.create_task(cri.pull_image(ref))
        seen: list[dict[str, Any]] = []

        async def read() -> None:
            async with stack.session().get(stack.pod_path("k", "imagepullprogress",
                                                          watch=True)) as resp:
                async for line in resp.content:
                    seen.append(json.loads(line))

        reader = asyncio.create_task(read())
        for _ in range(300):
            if any(o.get("phase") == "Downloading" for o in seen):
                break
            await asyncio.sleep(0.05)
        assert any(o.get("phase") == "Downloading" for o in seen), seen
        proc.kill()
        await proc.wait()
        # The agent is gone: the stream must end with an explicit error, not hang.
        await asyncio.wait_for(reader, 15)
        assert seen[-1]["kind"] == "Error" and "lost the stream" in seen[-1]["error"], seen[-1]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stack.kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                   endpoint_slice(int(stack.agent.url.rsplit(":", 1)[1])))
    await asyncio.sleep(0.5)
    code, objs = await stack.lines(stack.pod_path("k", "imagepullprogress", watch=True))
    await pull
    assert code == 200 and objs[-1]["kind"] == "Summary", objs[-1:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_port(port: int, within: float = 20.0) -> None:
    end = time.monotonic() + within
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


async def test_client_disconnect_ends_agent_subscription(
        stack: Stack, busybox_image: str) -> None:
    stack.kube.put("api/v1", "pods", pod_object("idle", [("app", busybox_image + "x")]))
    poller = stack.agent.app[agent_app.PARTS].poller
    async with stack.session().get(stack.pod_path("idle", "imagepullprogress",
                                                  watch=True)) as resp:
        assert resp.status == 200
        await resp.content.readline()  # the first object: the stream is live
        assert poller.subscribers == 1
    for _ in range(100):
        if poller.subscribers == 0:
            break
        await asyncio.sleep(0.05)
    assert poller.subscribers == 0


async def test_failed_pull_ends_with_the_registry_error(
        stack: Stack, cri: CRIClient, registry: Any) -> None:
    ref = f"{registry.host}/aggapi-test/missing:nope"
    pod = pod_object("bad", [("app", ref)])
    stack.kube.put("api/v1", "pods", pod)
    # Kubelet stand-in: pull through CRI, report what CRI said as kubelet's events do.
    with pytest.raises(RuntimeCallError) as err:
        await cri.pull_image(ref)
    text = err.value.details
    assert text
    stack.add_event(pod, "Pulling", "app", f'Pulling image "{ref}"', "2026-01-01T00:00:01Z")
    stack.add_event(pod, "Failed", "app", f'Failed to pull image "{ref}": {text}',
                    "2026-01-01T00:00:02Z")
    stack.add_event(pod, "BackOff", "app", f'Back-off pulling image "{ref}"',
                    "2026-01-01T00:00:03Z")
    # A snapshot reports the BackOff as it is (following would wait for the retry).
    code, objs = await stack.lines(stack.pod_path("bad", "imagepullprogress"),
                                   follow="false")
    assert code == 200
    assert [o["phase"] for o in progress(objs)] == ["BackOff"]
    assert [o["kind"] for o in objs if o["kind"] != "Progress"] == ["Error"]
    assert objs[-1]["phase"] == "BackOff" and objs[-1]["error"] == text


async def test_plain_path_ends_cleanly_before_deadline(
        stack: Stack, busybox_image: str) -> None:
    stack.server.handler(PodProgressHandler).stream_deadline = 2.0
    stack.kube.put("api/v1", "pods", pod_object("slow", [("app", busybox_image + "-never")]))
    t0 = time.monotonic()
    async with stack.session().get(stack.pod_path("slow", "imagepullprogress")) as resp:
        raw = await resp.read()
    took = time.monotonic() - t0
    assert resp.status == 200 and 1.5 < took < 6, took
    assert raw.endswith(b"\n")  # never cut mid-line
    last = json.loads(raw.splitlines()[-1])
    assert last["kind"] == "Timeout"
    assert last["resume"].startswith(
        "/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/default/pods/slow/")


async def test_server_sent_events(stack: Stack, cri: CRIClient, busybox_image: str) -> None:
    await cri.pull_image(busybox_image)
    stack.kube.put("api/v1", "pods", pod_object("sse", [("app", busybox_image)]))
    async with stack.session().get(stack.pod_path("sse", "imagepullprogress"),
                                   headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = (await resp.read()).decode()
    events = [b for b in text.split("\n\n") if b.strip()]
    datas = [json.loads(line[len("data: "):]) for b in events for line in b.splitlines()
             if line.startswith("data: ")]
    assert len(datas) == len(events) and datas[-1]["kind"] == "Summary"
    assert "event: summary" in events[-1]


@pytest.mark.parametrize(("event_first", "pull_first"), [
    (True, True), (False, True), (True, False)],
    ids=["event-first", "stream-first", "slot-taken-later"])
async def test_waiting_for_a_pull_slot(
        tmp_path: Path, stack: Stack, cri: CRIClient, ctd: Any, throttle: ThrottleProxy,
        big_image: Any, busybox_image: str, event_first: bool, pull_first: bool) -> None:
    """KEP-3673: kubelet said Pulling, the runtime shows nothing, the node is at its
    limit (maxParallelImagePulls: 1, one pull in flight) -> Waiting, with the pulls.
    stream-first: the Pulling event comes while the stream is open and the agent has
    nothing new to say; the stream must still turn to Waiting. slot-taken-later: the
    other pull starts only after the stream is open (kubelet says Pulling for both
    before either starts), and again the agent has nothing new to say."""
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                       "serializeImagePulls: false\nmaxParallelImagePulls: 1\n")
    async with run_agent(stack.agent.pki, cri=cri, containerd=ctd, kubelet_config=str(kubelet),
                         copy=CopyLimits(state_dir=str(tmp_path / "inflight3"))) as limited:
        stack.kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                       endpoint_slice(int(limited.url.rsplit(":", 1)[1])))
        await asyncio.sleep(0.5)
        throttle.set_rate(8 << 20)
        first: asyncio.Task[Any] | None = None

        def start_first() -> None:
            nonlocal first
            first = asyncio.create_task(cri.pull_image(big_image.ref(throttle.host)))

        if pull_first:
            start_first()
        queued_ref = busybox_image.replace("busybox:1", "busybox:queued")
        pod = pod_object("second", [("app", queued_ref)])
        stack.kube.put("api/v1", "pods", pod)

        def pulling() -> None:
            stack.add_event(pod, "Pulling", "app", f'Pulling image "{queued_ref}"',
                            "2026-01-01T00:00:01Z")

        if event_first:
            pulling()
        await asyncio.sleep(1.5)  # the first pull is in flight
        seen: list[dict[str, Any]] = []

        async def read() -> None:
            async with stack.session().get(stack.pod_path("second", "imagepullprogress",
                                                          watch=True)) as resp:
                async for line in resp.content:
                    seen.append(json.loads(line))
                    if len(seen) == 1 and not (event_first and pull_first):
                        assert "waiting" not in seen[0]  # no Pulling, or no pull in flight
                        if not event_first:
                            pulling()
                        if not pull_first:
                            start_first()
                    if seen[-1].get("waiting", {}).get("inFlightCount"):
                        return

        try:
            await asyncio.wait_for(read(), 30)
        finally:
            assert first is not None
            first.cancel()
            with pytest.raises((asyncio.CancelledError, RuntimeCallError)):
                await first
    waiting = seen[-1]
    assert waiting["phase"] == "Waiting"
    assert waiting["waiting"]["limit"] == 1
    assert waiting["waiting"]["slots"]["limit"] == 1
    assert waiting["waiting"]["inFlightCount"] >= 1
