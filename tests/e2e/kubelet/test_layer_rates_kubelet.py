"""Per-layer speed and ETA, end to end (issue 14): a real pod's image has three layers
that containerd downloads in parallel, each paced at its own rate by a throttle proxy
(tests.framework.throttle, per-blob buckets); the layer-granularity stream of the aggapi
apiserver must give each layer its own rate, and an ETA at mid-download that matches
when that layer really finished."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest

from tests.e2e.kubelet.conftest import (
    ProgressStream,
    create_pods,
    delete_pods,
    forget_images,
    pod,
)
from tests.framework import oci
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import OCI_CACHE, Node
from tests.framework.throttle import ThrottleProxy

MiB = 1 << 20
IMAGE = "aggapi-test/three-rates:1"
# (size, seconds alone): the smallest layer is the slowest, so the image's rate would
# promise it far too early.
LAYERS = ((12 * MiB, 8.0), (10 * MiB, 10.0), (8 * MiB, 12.0))


@pytest.fixture(scope="module")
def three_layers(node: Node) -> list[oci.Blob]:
    cache = oci.BlobCache(OCI_CACHE)
    layers = [cache.random_layer(size, seed=f"three-rates-{i}")
              for i, (size, _) in enumerate(LAYERS)]
    image = oci.build_image([cache.busybox_layer(), *layers],
                            cmd=["/bin/busybox", "sleep", "3600"],
                            labels={"io.aggapi.test": "three-rates"})
    repo, tag = IMAGE.split(":")
    oci.push_image(node.info.registry_host, repo, image, tag)
    return [la.blob for la in layers]


@pytest.fixture(scope="module")
def blob_throttle(node: Node) -> Iterator[ThrottleProxy]:
    """A proxy of this module's own in front of the node's registry (the node's proxy
    paces all blobs together); containerd is told to pull from it over plain HTTP the
    way tests.framework.containerd registers hosts (hosts.toml, read at each pull)."""
    with node.own_throttle() as proxy:
        yield proxy


def test_parallel_layers_have_their_own_rate_and_eta(
        control_plane: ControlPlane, node: Node, real_node: Kubelet,
        three_layers: list[oci.Blob], blob_throttle: ThrottleProxy) -> None:
    cp = control_plane
    delete_pods(cp, "krates")  # left by an earlier failed run
    forget_images(node, IMAGE)
    rates = {b.digest: size / secs for b, (size, secs) in zip(three_layers, LAYERS,
                                                              strict=True)}
    blob_throttle.set_blob_rates(dict(rates))
    stream = None
    try:
        create_pods(cp, [pod(node, "krates", [{"name": "c",
                                               "image": f"{blob_throttle.host}/{IMAGE}"}])])
        stream = ProgressStream(cp, "krates").start()
        assert stream.wait(180) == 0, stream.stderr
    finally:
        blob_throttle.set_blob_rates({})
        if stream is not None:
            stream.stop()
    objs = stream.objects
    assert objs and objs[-1][1]["kind"] == "Summary", objs[-3:]
    reported: dict[str, float] = {}
    windows = []
    for b in three_layers:
        seq = [(t, o) for t, o in objs
               if o.get("kind") == "Progress" and o.get("layer") == b.digest]
        assert seq, f"no progress for layer {b.digest}"
        finished = next(t for t, o in seq if int(o["progress"]) >= b.size)
        mid = [(t, o) for t, o in seq if o.get("phase") == "Downloading" and o.get("etaSeconds")
               and 0.4 * b.size <= int(o["progress"]) <= 0.6 * b.size]
        assert mid, (b.digest, [(round(t, 1), o.get("phase"), o.get("progress")) for t, o in seq])
        t_mid, o_mid = mid[len(mid) // 2]
        actual_left = finished - t_mid
        print(f"layer {b.digest[:19]} throttle {rates[b.digest]:.0f} B/s: said "
              f"{o_mid['bytesPerSecond']:.0f} B/s, ETA {o_mid['etaSeconds']:.1f} s at "
              f"{int(o_mid['progress']) / b.size:.0%}; finished {actual_left:.1f} s later")
        # Same tolerance as tests/agent/test_agent_integration.py (plus 1 s of transport:
        # the objects are stamped when kubectl delivered them, not when the agent made them).
        assert actual_left / 2 - 1 <= o_mid["etaSeconds"] <= actual_left * 2 + 1, \
            (o_mid, actual_left)
        reported[b.digest] = statistics.median(o["bytesPerSecond"] for _, o in mid)
        assert 0.5 * rates[b.digest] <= reported[b.digest] <= 1.5 * rates[b.digest], \
            (reported[b.digest], rates[b.digest])
        windows.append((seq[0][0], finished))
    # They really overlapped (containerd fetched them in parallel), so an image-wide
    # rate would have been the sum: each reported rate stays below that sum's half.
    assert max(w[0] for w in windows) < min(w[1] for w in windows), windows
    total = sum(rates.values())
    assert all(r < 0.75 * total for r in reported.values()), (reported, total)
    by_throttle = sorted(rates, key=rates.__getitem__)
    assert sorted(reported, key=reported.__getitem__) == by_throttle, (reported, rates)
    delete_pods(cp, "krates")
