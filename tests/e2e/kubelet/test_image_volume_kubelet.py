"""pods/imagepullprogress for an image volume (KEP-4639) pulled by the real kubelet.

KEP-5334 asks for progress on "all containers and image-backed volumes". kubelet pulls
a ``volumes[].image`` through CRI like a container's image, but its events name the pod,
not a container (no fieldPath), so aggapi matches them by image and reports the volume's
name where a container's would stand. The harness turns the ImageVolume gate on where
the release has it (tests/framework/kubetools.py ``feature_gates``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.kubelet.conftest import (
    GV,
    KImages,
    delete_pods,
    follow_pull,
    forget_images,
    layer_rises,
    pod,
    wait_running,
)
from tests.framework import containerdconfig, oci
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.kubetools import has, lacks
from tests.framework.node import OCI_CACHE, Node

MiB = 1 << 20
REPO = "aggapi-test/volume-data:1"
VOLUME = "data"

pytestmark = pytest.mark.skipif(not has("gate-ImageVolume"), reason=lacks("gate-ImageVolume"))
# 1.6 pulls the image but cannot mount it, so the pod never runs (containerd >= 2.1 can).
needs_mounts = pytest.mark.skipif(
    containerdconfig.Flavor.from_env().version == containerdconfig.V1_6,
    reason="containerd 1.6 cannot mount image volumes (2.1 and later can)")


@pytest.fixture(scope="module")
def volume_image(node: Node) -> oci.Image:
    """Two data layers of their own (no layer shared with another test image, so both
    are downloaded) and a file that names the image."""
    cache = oci.BlobCache(OCI_CACHE)
    marker = cache.files_layer([oci.TarEntry("image-id", data=REPO.encode())])
    image = oci.build_image([marker, cache.random_layer(12 * MiB, seed=REPO + "/1"),
                             cache.random_layer(8 * MiB, seed=REPO + "/2")],
                            labels={"io.aggapi.test": REPO})
    repo, tag = REPO.split(":")
    oci.push_image(node.info.registry_host, repo, image, tag)
    return image


@needs_mounts
def test_image_volume_progress_under_the_volume_name(
        control_plane: ControlPlane, node: Node, real_node: Kubelet, kimages: KImages,
        volume_image: oci.Image) -> None:
    cp = control_plane
    delete_pods(cp, "kvol")  # left by an earlier failed run (before forgetting the image)
    forget_images(node, REPO)
    vol_ref = node.via_throttle(REPO)
    app = node.via_registry(kimages.tar)  # busybox; not throttled, usually present
    node.set_rate(3 * MiB)  # ~20 MiB: ~7 s, long enough to see partial progress
    objs = follow_pull(cp, [pod(node, "kvol", [
        {"name": "c", "image": app,
         "volumeMounts": [{"name": VOLUME, "mountPath": "/data", "readOnly": True}]}],
        volumes=[{"name": VOLUME, "image": {"reference": vol_ref,
                                            "pullPolicy": "IfNotPresent"}}])], "kvol",
        reset=lambda: node.set_rate(None), timeout=180)

    # Every object about the volume's image names the volume, and each layer rises
    # from a partial count to its size.
    mine = [o for o in objs if o.get("kind") == "Progress" and o.get("image") == vol_ref]
    assert mine, [(o.get("kind"), o.get("container"), o.get("image")) for o in objs][:10]
    assert {o["container"] for o in mine} == {VOLUME}, {o["container"] for o in mine}
    for layer in volume_image.layers:
        digest, size = layer.blob.digest, layer.blob.size
        seen = layer_rises(mine, digest, size)
        if size > MiB:
            assert any(0 < p < size for p in seen), f"{digest}: no partial progress {seen}"
    assert any(o["phase"] == "Downloading" for o in mine)

    final: dict[str, Any] = objs[-1]
    by_name = {i["container"]: i for i in final["images"]}
    assert by_name[VOLUME]["image"] == vol_ref and by_name[VOLUME]["phase"] == "Done", final
    assert "c" in by_name, final

    # The volume is mounted: the file the image carries reads back through pods/copy.
    wait_running(cp, "kvol")
    body = cp.kubectl("get", "--raw", f"{GV}/namespaces/default/pods/kvol/copy"
                      f"?container=c&path=/data/image-id").stdout
    assert body == REPO, body
    delete_pods(cp, "kvol")


def test_kube_apiserver_keeps_image_volumes(control_plane: ControlPlane) -> None:
    """kube-apiserver keeps ``volumes[].image`` (the gate is on there too): a server-side
    dry run of such a pod comes back with the field, not stripped."""
    pod_obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kvol-dry"},
               "spec": {"containers": [{"name": "c", "image": "x"}],
                        "volumes": [{"name": VOLUME, "image": {"reference": "x"}}]}}
    out = json.loads(control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f",
                                           "-", input=json.dumps(pod_obj)).stdout)
    assert out["spec"]["volumes"][0].get("image", {}).get("reference") == "x", out["spec"]
