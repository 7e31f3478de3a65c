"""A pull's lifecycle as the real kubelet lives it (issue 23): a BackOff retry followed
to the end, images behind an init container Pending (not Waiting), and a re-pull
under imagePullPolicy Always of a tag that moved."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.e2e.kubelet.conftest import (
    GV,
    KImages,
    ProgressStream,
    create_pods,
    delete_pods,
    events,
    follow_pull,
    forget_images,
    pod,
    wait_for,
    wait_running,
)
from tests.framework import oci
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import OCI_CACHE, Node

MiB = 1 << 20
PRESENT = ("Done", "AlreadyPresent")


def push(node: Node, ref: str, size: int, seed: str) -> tuple[str, str]:
    """A busybox image with one random layer of ``size`` bytes, pushed as ``ref``; the
    digests of its (busybox, random) layers."""
    cache = oci.BlobCache(OCI_CACHE)
    repo, tag = ref.split(":")
    layers = [cache.busybox_layer(), cache.random_layer(size, seed=seed)]
    oci.push_image(node.info.registry_host, repo, oci.build_image(
        layers, cmd=["/bin/busybox", "sleep", "3600"], labels={"io.aggapi.test": repo}), tag)
    return layers[0].blob.digest, layers[1].blob.digest


def progress(objs: list[dict[str, Any]], container: str = "c") -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == "Progress" and o.get("container") == container]


def finals(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") in ("Summary", "Error", "Timeout")]


def test_backoff_retry_is_followed_to_the_summary(control_plane: ControlPlane, node: Node,
                                                  real_node: Kubelet) -> None:
    """The image does not exist yet: Failed, BackOff; it is pushed while kubelet backs
    off, and the same stream (follow=true) shows kubelet's next attempt Pulling, then
    Done, and ends with one Summary. At 622964a it ended at the first failure."""
    cp = control_plane
    ref = f"aggapi-test/late:{uuid.uuid4().hex[:12]}"  # never there before this run
    image = node.via_throttle(ref)
    delete_pods(cp, "klate")
    stream = None
    try:
        create_pods(cp, [pod(node, "klate", [{"name": "c", "image": image}])])
        stream = ProgressStream(cp, "klate", granularity="image").start()
        wait_for(lambda: any(o.get("phase") == "BackOff" for _, o in stream.objects), 120,
                 "BackOff on the stream")
        node.set_rate(1 * MiB)  # the retry's 4 MiB take seconds: its phases are seen
        push(node, ref, 4 * MiB, seed=ref)
        assert stream.wait(240) == 0, stream.stderr
    finally:
        node.set_rate(None)
        if stream is not None:
            stream.stop()
    objs = [o for _, o in stream.objects]
    assert [o["kind"] for o in finals(objs)] == ["Summary"], finals(objs)
    assert objs[-1]["kind"] == "Summary" and objs[-1]["complete"] is True, objs[-1]
    mine = progress(objs)
    phases = [o["phase"] for o in mine]
    backoff = phases.index("BackOff")
    assert "not found" in mine[backoff]["error"], mine[backoff]
    assert mine[backoff]["backOffSeconds"] >= 10
    after = mine[backoff + 1:]
    retry = next(i for i, o in enumerate(after) if o["phase"] == "Pulling"
                 and o["attempt"] > mine[backoff]["attempt"])
    assert any(o["phase"] == "Downloading" for o in after[retry:]), phases
    assert after[-1]["phase"] == "Done", phases
    attempts = [o["attempt"] for o in mine]
    assert attempts == sorted(attempts), attempts
    # kubelet's own account: it pulled more than once, the last time successfully.
    pulling = [e for e in events(cp, "klate") if e.get("reason") == "Pulling"]
    assert sum(int(e.get("count") or 1) for e in pulling) >= 2
    delete_pods(cp, "klate")


def test_images_behind_an_init_container_are_pending(control_plane: ControlPlane,
                                                    node: Node, real_node: Kubelet,
                                                    kimages: KImages) -> None:
    """While the init container's image pulls, the app's is Pending: kubelet has not
    asked for it. At 622964a it was Waiting, which means 'at the node's pull limit'."""
    cp = control_plane
    forget_images(node, kimages.init, kimages.app_a)
    init, app = node.via_throttle(kimages.init), node.via_throttle(kimages.app_a)
    node.set_rate(512 * 1024)  # the init image's 3 MiB: ~6 s of Downloading
    delete_pods(cp, "kinit2")
    objs = follow_pull(cp, [pod(node, "kinit2", [{"name": "app", "image": app}],
                                init_containers=[{"name": "init", "image": init,
                                                  "command": ["/bin/busybox", "true"]}])],
                       "kinit2", reset=lambda: node.set_rate(None), timeout=180,
                       granularity="image")
    assert len(finals(objs)) == 1, objs[-3:]
    init_objs, app_objs = progress(objs, "init"), progress(objs, "app")
    assert any(o["phase"] == "Downloading" for o in init_objs), init_objs
    # While the init image still downloads, kubelet has not asked for the app's. (Not
    # up to init's Done object: kubelet's Pulled/Pulling events for init and app can
    # reach the stream a poll before the node shows init's image record, and the app
    # is then rightly Pulling.)
    init_downloading = max(i for i, o in enumerate(objs)
                           if o.get("container") == "init" and o.get("phase") == "Downloading")
    before = [o["phase"] for o in objs[:init_downloading]
              if o.get("kind") == "Progress" and o.get("container") == "app"]
    assert before and set(before) == {"Pending"}, before
    assert all(o["phase"] != "Waiting" for o in app_objs)
    assert app_objs[-1]["phase"] in PRESENT
    delete_pods(cp, "kinit2")


def test_always_repull_of_a_moved_tag_is_followed(control_plane: ControlPlane, node: Node,
                                                  real_node: Kubelet) -> None:
    """A tag the node has, moved to new content in the registry: kubelet pulls again
    under imagePullPolicy Always, and the stream follows that pull's bytes to Done."""
    cp = control_plane
    ref = f"aggapi-test/moving:{uuid.uuid4().hex[:12]}"
    image = node.via_throttle(ref)
    _, old_only = push(node, ref, 1 * MiB, seed=ref + "-v1")
    delete_pods(cp, "kold", "knew")
    create_pods(cp, [pod(node, "kold", [{"name": "c", "image": image}])])
    wait_running(cp, "kold")
    delete_pods(cp, "kold")
    new_layers = push(node, ref, 6 * MiB, seed=ref + "-v2")  # the tag moves
    node.set_rate(1 * MiB)
    objs = follow_pull(cp, [pod(node, "knew", [{"name": "c", "image": image}],
                                pull_policy="Always")],
                       "knew", reset=lambda: node.set_rate(None), timeout=180)
    assert len(finals(objs)) == 1, objs[-3:]
    assert objs[-1]["phase"] == "Done", objs[-1]
    layers = {o["layer"] for o in progress(objs)
              if o["phase"] == "Downloading" and 0 < (o["progress"] or 0) < (o["total"] or 0)}
    assert layers, [(o["layer"][:19], o["phase"], o["progress"]) for o in progress(objs)]
    # Only the new image's layers are listed: never the old one's own (at b8a55c6 it
    # was, Pending, Pulling, then AlreadyPresent).
    listed = {o["layer"] for o in progress(objs) if o["layer"]}
    assert listed == set(new_layers) and old_only not in listed, (listed, old_only)
    pulled = [e for e in events(cp, "knew") if e.get("reason") == "Pulled"]
    assert pulled and "Successfully pulled" in pulled[-1]["message"]
    delete_pods(cp, "knew")


def _node_pull_of(cp: ControlPlane, node: str, repo: str) -> bool:
    """The node's in-flight pulls (nodes/imagepulls, as admin) name ``repo``."""
    code, body = cp.get(f"{GV}/nodes/{node}/imagepulls")
    if code != 200:
        return False
    pulls = json.loads(body).get("pulls") or []
    return any(any(str(r).endswith("/" + repo) for r in p.get("repositories") or [])
               for p in pulls if isinstance(p, dict))


def test_other_tenants_pulls_are_a_count(control_plane: ControlPlane, node: Node,
                                         real_node: Kubelet, kimages: KImages) -> None:
    """kubelet pulls one image at a time; a pod in namespace tenant-a holds the slot,
    victor's pod in default waits. victor (aggapi-view in default, nothing on nodes)
    sees the other pull as a count; the admin, who may get nodes/imagepulls, sees it.
    At 622964a victor's Waiting objects named tenant-a's image."""
    cp, k = control_plane, real_node
    delete_pods(cp, "tb")
    cp.kubectl("delete", "pod", "ta", "-n", "tenant-a", "--grace-period=0", "--force",
               "--wait=true", "--ignore-not-found", check=False)
    cp.kubectl("create", "namespace", "tenant-a", check=False)
    k.restart(serialize_image_pulls=True, max_parallel_image_pulls=None)
    forget_images(node, kimages.kep_a, kimages.kep_b)
    a_img, b_img = node.via_throttle(kimages.kep_a), node.via_throttle(kimages.kep_b)
    # 40 MiB each: ~20 s per pull, one at a time (at 3 MiB/s, 13 s, a loaded machine
    # once had victor's stream start after the first pull ended: no Waiting seen)
    node.set_rate(2 * MiB)
    streams: list[ProgressStream] = []
    try:
        create_pods(cp, [pod(node, "ta", [{"name": "c", "image": a_img}],
                             namespace="tenant-a")])
        wait_for(lambda: any(e.get("reason") == "Pulling" for e in events(cp, "ta", "tenant-a")),
                 60, "tenant-a's pull to start")
        # ...and to have resolved its image: before that its lease names no image, and
        # for all the agent can tell it may be tb's own pull just starting (its
        # tentative claim), so tb would not read as waiting in that window.
        wait_for(lambda: _node_pull_of(cp, k.node_name, kimages.kep_a.split(":")[0]), 60,
                 "tenant-a's pull to resolve its image")
        create_pods(cp, [pod(node, "tb", [{"name": "c", "image": b_img}])])
        streams = [ProgressStream(cp, "tb", granularity="image", user="victor").start(),
                   ProgressStream(cp, "tb", granularity="image").start()]

        def seen_waiting() -> bool:  # (or ended: the assertions below then say why)
            return all((s.proc is not None and s.proc.poll() is not None)
                       or any(o.get("phase") == "Waiting" for _, o in s.objects)
                       for s in streams)

        # Once both streams have shown tb waiting, the rest of the two pulls is not
        # what is tested: unthrottled, they end in a second instead of ~25 s.
        wait_for(seen_waiting, 120, "tb Waiting on both streams")
        node.set_rate(None)
        for s in streams:
            assert s.wait(180) == 0, s.stderr
    finally:
        node.set_rate(None)
        for s in streams:
            s.stop()
    victor, admin = ([o for _, o in s.objects] for s in streams)
    for objs in (victor, admin):
        assert objs[-1]["kind"] == "Summary" and len(finals(objs)) == 1, objs[-3:]
    v_wait = [o["waiting"] for o in victor if o.get("phase") == "Waiting"]
    a_wait = [o["waiting"] for o in admin if o.get("phase") == "Waiting"]
    assert v_wait and a_wait, ([o.get("phase") for o in victor], [o.get("phase") for o in admin])
    assert all(w["inFlight"] == [] and w["inFlightCount"] >= 1 for w in v_wait), v_wait
    assert kimages.kep_a.split(":")[0] not in json.dumps(victor)
    # The admin sees tenant-a's pull: by its repository (containerd's distribution
    # source), or by image once someone follows tenant-a's pod.
    repo = kimages.kep_a.split(":")[0]
    assert any(any(r.endswith("/" + repo) for r in p.get("repositories") or [])
               or a_img in (p.get("images") or [])
               for w in a_wait for p in w["inFlight"]), a_wait
    delete_pods(cp, "tb")
    cp.kubectl("delete", "namespace", "tenant-a", "--wait=false", check=False)
