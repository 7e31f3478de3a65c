"""image-pull-progress over many pods against a fake podimagepulls server: one list and
one watch for every pod however many (2,000 here), a dropped watch resumed from its
resourceVersion, a relist on 410 Expired, and -o json through real kubectl."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aggapi.client.connection import Connection, ConnectionFlags
from aggapi.client.retry import Backoff
from aggapi.plugins import collection
from aggapi.plugins.pullset import Runner
from aggapi.plugins.targets import Target
from tests.plugins.fakecollection import FakeCollection, pod_image_pull
from tests.plugins.helpers import (
    KUBECTL,
    install_plugins,
    kubectl,
    kubectl_pty,
    plugin_env,
    screen_text,
)

MiB = 1 << 20


@pytest.fixture
async def fake() -> AsyncIterator[FakeCollection]:
    fc = FakeCollection()
    await fc.start()
    try:
        yield fc
    finally:
        await fc.stop()


@pytest.fixture
def plugin_bin(tmp_path: Path) -> Path:
    if not os.access(KUBECTL, os.X_OK):
        pytest.skip(f"kubectl not found at {KUBECTL}")
    install_plugins(tmp_path / "bin")
    return tmp_path / "bin"


async def pull_all(fc: FakeCollection, names: list[str], *, node_of: int = 50,
                   pause: float = 0.0) -> None:
    """Each pod half-way, then done, in batches of 200 (a rollout's bursts)."""
    for step in ("half", "done"):
        for i, n in enumerate(names):
            fc.put(pod_image_pull("ns", n, node=f"node-{i % node_of}",
                                  phase="Downloading" if step == "half" else "Done",
                                  progress=50 * MiB, total=100 * MiB))
            if i % 200 == 199:
                await asyncio.sleep(pause)


async def test_2000_pods_followed_whole_with_one_list_and_one_watch(
        fake: FakeCollection, plugin_bin: Path, tmp_path: Path) -> None:
    names = [f"web-{i:04d}" for i in range(2000)]
    for i, n in enumerate(names):
        fake.put(pod_image_pull("ns", n, node=f"node-{i % 50}", progress=0,
                                total=100 * MiB))
    fake.put(pod_image_pull("ns", "other", labels={"app": "db"}))  # not selected
    env = plugin_env(plugin_bin, fake.kubeconfig(tmp_path))
    before = os.times()
    run = asyncio.create_task(kubectl(env, "image-pull-progress", "-l", "app=web",
                                      timeout=120))
    t0 = asyncio.get_running_loop().time()
    await wait_verbs(fake, 2)
    await pull_all(fake, names, pause=0.05)
    res = await run
    wall = asyncio.get_running_loop().time() - t0
    after = os.times()
    # kubectl execs the plugin in its own process: the child's CPU is the plugin's.
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    print(f"plugin CPU, 2,000 pods listed, 4,000 watch events, plain output: {cpu:.2f} s "
          f"in {wall:.1f} s ({cpu / wall:.2f} cores, start-up included)")
    assert res.rc == 0, res.err[-2000:]
    last: dict[str, list[str]] = {}
    for ln in res.out.splitlines():
        f = ln.split()
        last[f[0]] = f
    assert set(last) == {f"ns/{n}" for n in names}  # every pod, no cap, not the db one
    assert all(f[3] == "Done" and f[4] == "100%" for f in last.values())
    assert fake.verbs() == ["list", "watch"]  # one of each, whatever the pod count
    assert not any("imagepullprogress" in p for _, p, _ in fake.requests)
    assert "2000 pods: 2000 done, 0 pulling" in res.err


async def runner(fc: FakeCollection, tmp_path: Path, target: Target) -> tuple[
        Runner, asyncio.Task[list[str]], Connection]:
    conn = await Connection.load(flags=ConnectionFlags(kubeconfig=str(fc.kubeconfig(tmp_path))))
    r = Runner(conn, target, "ns", fail_fast=False, redraw=lambda: None)
    return r, asyncio.create_task(r.run()), conn


async def wait_verbs(fc: FakeCollection, n: int) -> None:
    for _ in range(200):
        if len(fc.verbs()) >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(fc.verbs())


async def test_dropped_watch_resumes_from_the_last_version(
        fake: FakeCollection, tmp_path: Path) -> None:
    names = [f"p{i}" for i in range(10)]
    for n in names:
        fake.put(pod_image_pull("ns", n))
    fake.cut_watch_after = 4
    r, task, conn = await runner(fake, tmp_path, Target(label_selector="app=web"))
    try:
        await wait_verbs(fake, 2)
        await pull_all(fake, names)
        failures = await asyncio.wait_for(task, 20)
    finally:
        await conn.close()
    assert failures == [] and len(r.set.pods) == 10 and all(p.done for p in r.set.pods.values())
    watches = [q for _, p, q in fake.requests if q.get("watch")]
    assert fake.verbs() == ["list", "watch", "watch"]  # resumed, never relisted
    # the second watch starts where the 4th event left the first one
    assert int(watches[1]["resourceVersion"]) == int(watches[0]["resourceVersion"]) + 4


async def test_410_on_resume_relists(fake: FakeCollection, tmp_path: Path) -> None:
    """The history was compacted while the watch was down: the resume is 410 Expired,
    the plugin lists again, and a pod deleted meanwhile is gone from its set."""
    for n in ("a", "b", "c"):
        fake.put(pod_image_pull("ns", n))
    fake.cut_watch_after = 1
    fake.compact_on_cut = True
    r, task, conn = await runner(fake, tmp_path, Target(label_selector="app=web"))
    try:
        await wait_verbs(fake, 2)
        fake.put(pod_image_pull("ns", "a", phase="Done"))  # the one event that gets through
        fake.delete("ns", "b")  # the cut comes before this reaches the watch
        await wait_verbs(fake, 5)
        assert "ns/b" not in r.set.pods
        fake.put(pod_image_pull("ns", "c", phase="Done"))
        failures = await asyncio.wait_for(task, 20)
    finally:
        await conn.close()
    assert failures == [] and sorted(r.set.pods) == ["ns/a", "ns/c"]
    assert fake.verbs()[:5] == ["list", "watch", "watch", "list", "watch"]


async def test_410_error_event_relists(fake: FakeCollection, tmp_path: Path) -> None:
    fake.put(pod_image_pull("ns", "a"))
    fake.error_event_next_watch = True
    _, task, conn = await runner(fake, tmp_path, Target(label_selector="app=web"))
    try:
        await wait_verbs(fake, 4)
        fake.put(pod_image_pull("ns", "a", phase="Done"))
        assert await asyncio.wait_for(task, 20) == []
    finally:
        await conn.close()
    assert fake.verbs()[:4] == ["list", "watch", "list", "watch"]


async def test_keeps_following_through_a_replicas_loss(
        fake: FakeCollection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica deleted under the watch: the connection resets, the aggregator says 503
    while its endpoints change, empty watches, a replica that has not reached the
    version yet (504 Too large) — more failures in a row than a one-shot retry allows,
    and the plugin keeps following from its last version, never relisting."""
    monkeypatch.setattr(collection, "Backoff", functools.partial(Backoff, first=0.01, cap=0.02))
    for n in ("a", "b"):
        fake.put(pod_image_pull("ns", n))
    fake.cut_watch_after = 1
    fake.retry_after = 0
    r, task, conn = await runner(fake, tmp_path, Target(label_selector="app=web"))
    try:
        await wait_verbs(fake, 2)
        fake.failures = ["reset", "503", "empty", "504", "reset"] * 3
        fake.put(pod_image_pull("ns", "a", phase="Done"))  # through, then the cut
        await wait_verbs(fake, 2 + 1 + 15)
        fake.put(pod_image_pull("ns", "b", phase="Done"))
        failures = await asyncio.wait_for(task, 20)
    finally:
        await conn.close()
    assert failures == [] and all(p.done for p in r.set.pods.values())
    assert set(fake.verbs()) == {"list", "watch"} and fake.verbs().count("list") == 1
    watches = [q for _, p, q in fake.requests if q.get("watch")]
    assert {w["resourceVersion"] for w in watches[1:]} == {watches[-1]["resourceVersion"]}


async def test_json_streams_the_events_for_a_deployment(
        fake: FakeCollection, plugin_bin: Path, tmp_path: Path) -> None:
    """deployment/NAME: its spec.selector becomes the labelSelector of one list and
    watch; -o json prints each event as received, no screen."""
    fake.deployments[("ns", "web")] = {"spec": {"selector": {"matchLabels": {"app": "web"}}}}
    for n in ("a", "b"):
        fake.put(pod_image_pull("ns", n, progress=0))
    env = plugin_env(plugin_bin, fake.kubeconfig(tmp_path))
    run = asyncio.create_task(kubectl(env, "image-pull-progress", "deployment/web",
                                      "-o", "json", timeout=60))
    await wait_verbs(fake, 2)
    for n in ("a", "b"):
        fake.put(pod_image_pull("ns", n, progress=60 * MiB))
    for n in ("a", "b"):
        fake.put(pod_image_pull("ns", n, phase="Done"))
    res = await run
    assert res.rc == 0, res.err
    events = [json.loads(ln) for ln in res.out.splitlines()]
    sent = [{"type": "ADDED", "object": o} for _, t, o in fake.history[:2]] + \
        [{"type": t, "object": o} for _, t, o in fake.history[2:]]
    sent[0]["type"] = sent[1]["type"] = "ADDED"
    # the list's objects carry the version of their last change: the same as received
    assert events == sent
    assert "\x1b" not in res.out
    q = [q for _, p, q in fake.requests if p.endswith("/podimagepulls")]
    assert q[0] == {"labelSelector": "app=web"}
    assert q[1]["labelSelector"] == "app=web" and q[1]["watch"] == "true"
    assert fake.requests[0][1] == "/apis/apps/v1/namespaces/ns/deployments/web"


async def test_2000_pods_on_a_terminal_fit_its_height(
        fake: FakeCollection, plugin_bin: Path, tmp_path: Path) -> None:
    """On a 40-line terminal: the header, 36 rows (stuck first) and "… and K more"."""
    names = [f"web-{i:04d}" for i in range(2000)]
    for i, n in enumerate(names):
        fake.put(pod_image_pull("ns", n, node=f"node-{i % 50}", progress=0,
                                total=100 * MiB))
    fake.put(pod_image_pull("ns", "web-stuck", phase="BackOff", progress=None, total=None,
                            rate=None, reason="ImagePullBackOff: not found"))
    env = plugin_env(plugin_bin, fake.kubeconfig(tmp_path))
    before = os.times()
    run = asyncio.create_task(kubectl_pty(env, "image-pull-progress", "-l", "app=web",
                                          timeout=120))
    t0 = asyncio.get_running_loop().time()
    await wait_verbs(fake, 2)
    await asyncio.sleep(1.5)  # a few screens of the pull in progress
    await pull_all(fake, names, pause=0.05)
    fake.put(pod_image_pull("ns", "web-stuck", phase="Done"))
    res = await run
    wall = asyncio.get_running_loop().time() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    print(f"plugin CPU, 2,000 pods on a 40x140 terminal (rich): {cpu:.2f} s in {wall:.1f} s "
          f"({cpu / wall:.2f} cores, start-up included)")
    assert res.rc == 0, res.out[-3000:]
    screen = screen_text(res.out)
    assert "2001 pods: 0 done, 2000 pulling, 0 waiting for a slot, 1 stuck" in screen
    assert "2001 pods: 2001 done" in screen
    assert "slowest nodes: node-" in screen
    assert "… and 1965 more" in screen  # 40 lines: 2 header, 1 column header, 36 rows, 1
    first = re.search(r"^(ns/\S+)", screen.split("POD", 1)[1].lstrip("\n "), re.M)
    assert first and first.group(1) == "ns/web-stuck"  # stuck first
