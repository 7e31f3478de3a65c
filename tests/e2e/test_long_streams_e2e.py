"""Streams on the /watch/ path outlast kube-apiserver's 60 s request timeout, both ways:
a ~76 s image pull followed through pods/imagepullprogress, and a ~76 s upload through
pods/copy, through the real aggregator and real kubectl (kubelet stand-in's node).

Each must last over 70 s (kube-apiserver's 60 s plus a margin) to prove it, so the two
run at once: one test of ~76 s instead of two. They share no stream: the pull goes
through the throttle proxy into containerd, the upload through the agent into the
workload pod; each keeps every assertion it had as a test of its own
(tests/e2e/test_progress_e2e.py, tests/e2e/test_copy_e2e.py before).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from tests.framework.controlplane import ControlPlane
from tests.framework.node import Node
from tests.framework.procs import Proc
from tests.framework.standin import StandinKubelet, StandinPod, SyncStandin

from .conftest import (
    E2EPod,
    begin_pull,
    finish_pulling_pod,
    kubectl_argv,
    kubectl_stream,
    start_pulling_pod,
)

MiB = 1 << 20
OUTLAST = 70.0  # s: kube-apiserver's 60 s request timeout plus a margin
LONG_PULL_SECONDS = 76.0  # > OUTLAST
PLAIN_DEADLINE = 55.0  # aggapi's --stream-deadline default
LONG_UPLOAD_RATE = 1 * MiB  # bytes/s written into kubectl's stdin
LONG_UPLOAD_SIZE = 76 * MiB  # -> ~76 s: > OUTLAST


def progress(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == "Progress"]


async def test_pull_followed_and_upload_sent_past_kube_apiservers_timeout(
        control_plane: ControlPlane, node: Node, node_agent: Proc, workload_pod: E2EPod,
        standin: SyncStandin) -> None:
    # A TaskGroup: if one fails, the other is cancelled and its cleanup (pod, image,
    # throttle, kubectl) runs before the test ends.
    async with asyncio.TaskGroup() as tg:
        tg.create_task(follow_long_pull(control_plane, node, standin))
        tg.create_task(upload_for_over_70s(control_plane, workload_pod, standin))


async def follow_long_pull(control_plane: ControlPlane, node: Node,
                           standin: SyncStandin) -> None:
    """A ~100 s throttled pull, watched three ways at once:

    - the /watch/ path (verb watch: long-running in kube-apiserver): one stream from the
      first byte to the Summary, never truncated at kube-apiserver's 60 s;
    - the plain path (verb get): ends cleanly before kube-apiserver's timeout with a
      Timeout object whose ``resume`` is the /watch/ path;
    - that resume path, followed with kubectl, to the Summary.
    """
    sizes = dict(node.images.big_layers)
    total = sum(sizes.values())
    pod = start_pulling_pod(standin, node, "long-pull", rate=total / LONG_PULL_SECONDS,
                            start=False)
    try:
        watch_path = pod.path("imagepullprogress", watch=True)
        watch = asyncio.create_task(kubectl_stream(control_plane, watch_path, timeout=240))
        plain = asyncio.create_task(kubectl_stream(control_plane, pod.path("imagepullprogress"),
                                                   timeout=90))
        await asyncio.sleep(1.0)  # both streams are up before the first byte moves
        t0 = time.monotonic()
        begin_pull(standin, pod)

        p = await plain
        assert p.rc == 0, p.err
        assert p.seconds < 60, p.seconds  # before kube-apiserver's --request-timeout
        assert p.seconds > PLAIN_DEADLINE - 5, p.seconds
        assert p.raw.endswith(b"\n")  # ended between lines, not cut mid-object
        last = p.objects[-1]
        assert last["kind"] == "Timeout", last
        assert last["resume"].startswith(watch_path), last
        assert any(o["phase"] == "Downloading" for o in progress(p.objects))

        resumed = await kubectl_stream(control_plane, last["resume"], timeout=200)
        w = await watch
        pull_took = time.monotonic() - t0
        pulled: StandinPod = await asyncio.to_thread(pod.pull.result, 30)
        assert pulled.running is not None and not pulled.pull_errors
        assert pulled.obj["status"]["phase"] == "Running"
    finally:
        await asyncio.to_thread(finish_pulling_pod, standin, node, pod)
    assert pull_took > OUTLAST, pull_took

    base = node.images.big_layers[0][0]  # busybox: present if another pod ran busybox
    downloaded = total - sizes[base]
    for s in (w, resumed):
        assert s.rc == 0, s.err
        assert s.raw.endswith(b"\n")
        assert s.objects[-1]["kind"] == "Summary", s.objects[-1]
        assert s.objects[-1]["phase"] == "Done"
        assert s.objects[-1]["progress"] == s.objects[-1]["total"] >= downloaded
    assert resumed.objects[0]["kind"] == "Progress"  # a fresh stream: current state first

    # One uninterrupted stream longer than OUTLAST, live all along.
    assert w.seconds > OUTLAST, w.seconds
    objs = w.objects
    assert not any(o["kind"] in ("Timeout", "Error") for o in objs)
    by_layer: dict[str, list[dict[str, Any]]] = {}
    for o in progress(objs):
        assert o["container"] == "app" and o["image"] == pod.image
        if o["layer"]:
            by_layer.setdefault(o["layer"], []).append(o)
    assert set(by_layer) == set(sizes)
    for digest, seq in by_layer.items():
        offsets = [o["progress"] for o in seq]
        assert offsets == sorted(offsets), digest
        assert seq[-1]["phase"] in ("Done", "AlreadyPresent")
        if digest != base:
            assert seq[-1]["phase"] == "Done" and seq[-1]["progress"] == sizes[digest]
    downloading = [(t, o) for t, o in w.lines if o.get("phase") == "Downloading"]
    assert downloading[0][0] < 15 and downloading[-1][0] > OUTLAST - 10, \
        (downloading[0][0], downloading[-1][0])
    # The rate the agent reports is the throttle's (three layers share it).
    rates = [o["bytesPerSecond"] for _, o in downloading if o.get("bytesPerSecond")]
    assert rates and max(rates) < 3 * total / LONG_PULL_SECONDS



async def upload_for_over_70s(control_plane: ControlPlane, workload_pod: E2EPod,
                              standin: SyncStandin) -> None:
    """``kubectl create --raw /apis/.../watch/...copy -f -`` fed at 1 MiB/s for ~96 s.

    On the plain path kube-apiserver would cut it at 60 s; the /watch/ prefix makes it
    long-running. Midway, the bytes are already landing in the container (streamed, not
    buffered by kubectl or kube-apiserver). Then the file is downloaded and compared.
    """
    target = "/tmp/e2e-long.bin"
    q = {"container": workload_pod.container, "path": target}
    pid = await _container_pid(standin, workload_pod)
    before = _tmp_sizes(pid)
    argv = kubectl_argv(control_plane, "alice", "create", "--raw",
                        workload_pod.path("copy", q, watch=True), "-f", "-")
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None
    want = hashlib.sha256()
    block = os.urandom(64 * 1024)
    sent = 0
    growing: list[int] = []
    try:
        while sent < LONG_UPLOAD_SIZE:
            chunk = sent.to_bytes(8, "big") + block[8:]  # every chunk differs
            want.update(chunk)
            proc.stdin.write(chunk)
            await proc.stdin.drain()
            sent += len(chunk)
            ahead = sent / LONG_UPLOAD_RATE - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
            if not growing and time.monotonic() - t0 > 45:
                # Midway: a temporary file in the target directory already holds most of
                # what was sent (the agent writes O_EXCL temp, then renames).
                now = {n: s for n, s in _tmp_sizes(pid).items() if n not in before}
                growing.append(max(now.values(), default=0))
        proc.stdin.close()
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    took = time.monotonic() - t0
    assert proc.returncode == 0, err.decode()
    assert took > OUTLAST, took
    reply = json.loads(out)
    assert reply == {"path": target, "size": LONG_UPLOAD_SIZE, "sha256": want.hexdigest()}
    assert growing and growing[0] > 30 * MiB, growing

    # Download it back (the /watch/ path too) and compare, streaming into a hash.
    got, n = hashlib.sha256(), 0
    dl = await asyncio.create_subprocess_exec(
        *kubectl_argv(control_plane, "alice", "get", "--raw",
                      workload_pod.path("copy", q, watch=True)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert dl.stdout is not None
    while chunk := await dl.stdout.read(1 << 20):
        got.update(chunk)
        n += len(chunk)
    await dl.wait()
    assert dl.returncode == 0
    assert n == LONG_UPLOAD_SIZE and got.hexdigest() == want.hexdigest()


async def _container_pid(standin: SyncStandin, pod: E2EPod) -> int:
    async def go(k: StandinKubelet) -> int:
        st = await k.cri.container_status(pod.pod.container_id(pod.container))
        assert st is not None and st.pid
        return st.pid

    return await asyncio.to_thread(standin.call, go)


def _tmp_sizes(pid: int) -> dict[str, int]:
    """Sizes of the files in the container's /tmp, seen from the host."""
    root = Path(f"/proc/{pid}/root/tmp")
    out = {}
    for p in root.iterdir():
        try:
            if p.is_file():
                out[p.name] = p.stat().st_size
        except OSError:
            pass
    return out
