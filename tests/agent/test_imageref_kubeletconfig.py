"""Image reference normalization (as containerd names records) and kubelet limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggapi import imageref
from aggapi.agent import kubeletconfig
from aggapi.agent.progress.ocimanifest import Platform, chain_ids

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(("ref", "want"), [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("index.docker.io/foo/bar", "docker.io/foo/bar:latest"),
    ("localhost/app", "localhost/app:latest"),
    ("127.0.0.1:5000/a/b:1", "127.0.0.1:5000/a/b:1"),
    (f"busybox:1.36@{D}", f"docker.io/library/busybox@{D}"),
    (f"ghcr.io/x/y@{D}", f"ghcr.io/x/y@{D}"),
])
def test_normalize(ref: str, want: str) -> None:
    assert imageref.normalize(ref) == want


@pytest.mark.parametrize("ref", ["", "Busybox", "a//b", "busybox@sha256:abc", "x:"])
def test_invalid(ref: str) -> None:
    with pytest.raises(imageref.InvalidReference):
        imageref.parse(ref)


def test_host_drops_port_as_containerd_labels_do() -> None:
    assert imageref.parse("127.0.0.1:5000/a/b:1").host == "127.0.0.1"


def test_platform_and_chain_ids() -> None:
    assert Platform("linux", "arm64").matches({"os": "linux", "architecture": "arm64",
                                               "variant": "v8"})
    assert not Platform("linux", "amd64").matches({"os": "linux", "architecture": "arm64"})
    a, b = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert chain_ids([a, b])[0] == a and chain_ids([a, b])[1] != b


async def test_kubelet_limits_from_yaml_json_and_missing(tmp_path: Path) -> None:
    y = tmp_path / "k.yaml"
    y.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                 "serializeImagePulls: false\nmaxParallelImagePulls: 3\n")
    lim = await kubeletconfig.KubeletConfigReader(str(y)).limits()
    assert (lim.serialize_image_pulls, lim.max_parallel_image_pulls, lim.parallel_slots) == (
        False, 3, 3)
    j = tmp_path / "k.json"
    j.write_text('{"kind": "KubeletConfiguration"}')
    lim = await kubeletconfig.KubeletConfigReader(str(j)).limits()
    assert (lim.serialize_image_pulls, lim.parallel_slots, lim.error) == (True, 1, "")
    lim = await kubeletconfig.KubeletConfigReader(str(tmp_path / "none")).limits()
    assert lim.error and lim.serialize_image_pulls  # defaults, with the reason
    with pytest.raises(ValueError):
        kubeletconfig.parse("maxParallelImagePulls: 0")
