"""Faults on the installed add-on, each printing its figures.

(a) an apiserver pod is deleted while a client follows a pull on the /watch/ path: the
    stream of the client ends within 5 s of the deletion of the replica serving it (an
    object saying to resume, or a clean close; never a hang), a retry is answered at once
    by the other replica, and the APIService stays Available;
(b) the agent pod of a node is deleted during a 256 MiB upload: the target file is
    unchanged, no temp file is left once the DaemonSet's new agent runs, the retry succeeds;
(c) ``helm upgrade`` to another image tag (the same image re-tagged on every node with
    ``ctr images tag``): a loop of non-streaming requests sees no failure during the roll.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.e2e.addon.helpers import (
    MiB,
    PacedUpload,
    RawStream,
    delete_pods,
    download,
    exec_in,
    path,
    run_pod,
    until,
)
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.kubelet import forget_images
from tests.framework.rollout import Prober

pytestmark = pytest.mark.e2e
STREAM_END = 5.0


def _delete(a: Addon, pod: str, *extra: str) -> float:
    t = time.monotonic()
    a.kubectl("-n", a.namespace, "delete", "pod", pod, "--wait=false", *extra)
    return t


def test_apiserver_pod_deleted_during_a_watch_stream(installed_addon: Addon,
                                                     two_node_cluster: Cluster) -> None:
    a, reg = installed_addon, two_node_cluster.registry
    cp = a.cp
    node = two_node_cluster.node(1)
    repo_tag = reg.tag(reg.images.big, "addon-fault-a")
    asyncio.run(forget_images(node.cri_address, repo_tag))
    reg.set_rate(1 * MiB)  # ~150 s: the pull outlasts both deletions
    watch = path("imagepullprogress", "addon-slow", watch=True, granularity="image")
    streams: list[RawStream] = []
    try:
        run_pod(cp, "addon-slow", node.name, reg.via_throttle(repo_tag), command=(),
                pull_policy="IfNotPresent", wait=False)
        stream = RawStream(cp, watch).start()
        streams.append(stream)
        stream.wait_objects(1, 60)
        with Prober(cp, [n.name for n in two_node_cluster.nodes]) as probe:
            # Which replica serves the stream is kube-apiserver's choice: delete one; if
            # the stream goes on, it was the other, which is deleted next (once the first
            # one's replacement is Ready).
            ended_after = None
            for victim in [p["metadata"]["name"] for p in a.apiserver_pods()]:
                t_del = _delete(a, victim)
                if stream.wait_end(STREAM_END + 2):
                    assert stream.ended is not None
                    ended_after = stream.ended - t_del
                    break
                a.wait_ready(timeout=120)
            assert ended_after is not None, "the stream outlived both replicas' deletion"
            last = stream.objects[-1][1] if stream.objects else {}
            assert stream.proc is not None and stream.proc.returncode == 0, \
                stream.read_stderr()
            # Retry at once: the other replica answers.
            t_retry = time.monotonic()
            retry = RawStream(cp, watch).start()
            streams.append(retry)
            retry.wait_objects(1, 10)
            first_object = retry.objects[0][0] - t_retry
            a.wait_ready(timeout=120)
        r = probe.result
        print(f"\nfault (a): stream ended {ended_after:.1f}s after its replica's deletion "
              f"(last object: {last.get('kind')}); retry's first object after "
              f"{first_object:.2f}s; {r.line()}")
        assert ended_after <= STREAM_END
        assert first_object < 3
        assert r.unavailable_seconds == 0, r.line()
        assert not r.failures, r.failures[:10]
    finally:
        reg.set_rate(None)
        for s in streams:
            s.stop()
        delete_pods(cp, "addon-slow")


def _temp_files(a: Addon, pod: str) -> list[str]:
    out = exec_in(a.cp, pod, "ls", "-A", "/tmp/up")
    return [n for n in out.split() if n.startswith(".aggapi-tmp-")]


def test_agent_pod_deleted_during_a_256mib_upload(installed_addon: Addon,
                                                  two_node_cluster: Cluster,
                                                  tmp_path: Path) -> None:
    a = installed_addon
    cp = a.cp
    node = two_node_cluster.node(2)
    run_pod(cp, "addon-up", node.name)
    try:
        exec_in(cp, "addon-up", "sh", "-c", "mkdir -p /tmp/up && echo original > /tmp/up/target")
        before = exec_in(cp, "addon-up", "sha256sum", "/tmp/up/target").split()[0]
        p = path("copy", "addon-up", watch=True, container="c", path="/tmp/up/target")
        up = PacedUpload(cp, p, 256 * MiB, rate=16 * MiB).start()  # ~16 s
        until(lambda: _temp_files(a, "addon-up"), 30, "the upload's temp file")
        agent = a.agent_pod(node.name)["metadata"]["name"]
        sent_at_kill = up.sent
        t_del = _delete(a, agent, "--grace-period=1")
        rc = up.wait(120)
        assert rc != 0, f"the upload succeeded although its agent was deleted: {up.out}"
        failed_after = time.monotonic() - t_del
        # The DaemonSet's new agent: Ready, and its start-up cleanup removed the temp file.
        until(lambda: a.agent_pod(node.name)["metadata"]["name"] != agent
              and a.ready(a.agent_pod(node.name)), 120, "a new Ready agent")
        t_ready = time.monotonic() - t_del
        until(lambda: not _temp_files(a, "addon-up"), 30, "temp files removed")
        assert exec_in(cp, "addon-up", "sha256sum", "/tmp/up/target").split()[0] == before
        # Retry (unpaced): succeeds, and the file is the new content.
        retry = PacedUpload(cp, p, 256 * MiB, rate=1e12).start()
        assert retry.wait(300) == 0, retry.err
        assert json.loads(retry.out)["sha256"] == retry.digest
        got = download(cp, p, tmp_path / "back")
        assert got == retry.digest
        print(f"\nfault (b): agent deleted after {sent_at_kill / MiB:.0f} MiB sent; upload "
              f"failed {failed_after:.1f}s later ({up.err.strip()[:120]}); new agent Ready "
              f"after {t_ready:.1f}s; target unchanged, no temp file; retry of 256 MiB ok")
    finally:
        delete_pods(cp, "addon-up")


def test_helm_upgrade_to_another_image_tag_fails_no_request(installed_addon: Addon,
                                                            two_node_cluster: Cluster) -> None:
    a = installed_addon
    old = a.image_tag
    a.tag_image("dev-upgrade")
    before = {p["metadata"]["name"] for p in a.apiserver_pods()}
    try:
        with Prober(a.cp, [n.name for n in two_node_cluster.nodes]) as probe:
            t0 = time.monotonic()
            a.upgrade(image_tag="dev-upgrade")
            want = a.image
            a.wait_ready(timeout=300)
            rolled = time.monotonic() - t0
            time.sleep(2)  # requests after the last old pod is gone
        images = {c["image"] for p in a.apiserver_pods() + a.pods("agent")
                  for c in p["spec"]["containers"]}
        after = {p["metadata"]["name"] for p in a.apiserver_pods()}
    finally:  # the release's image again for the tests after this one
        a.upgrade(image_tag=old)
        a.wait_ready(timeout=300)
    r = probe.result
    print(f"\nfault (c): helm upgrade {old or 'release'} -> dev-upgrade rolled in {rolled:.1f}s; "
          f"{r.line()}")
    assert images == {want} and want.endswith(":dev-upgrade")
    assert not before & after
    assert r.requests > 50
    assert not r.failures, r.failures[:10]
    assert r.unavailable_seconds == 0, r.line()
