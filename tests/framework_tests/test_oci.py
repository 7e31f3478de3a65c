"""tests.framework.oci: digests are real, layers are reproducible, pushes land."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import urllib.request
from pathlib import Path

from tests.framework import oci
from tests.framework.registry import Registry


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_random_layer_digests_and_cache(tmp_path: Path) -> None:
    cache = oci.BlobCache(tmp_path)
    layer = cache.random_layer(300_000, seed="t")
    raw = layer.blob.read()
    assert layer.blob.digest == _sha(raw) and layer.blob.size == len(raw)
    tar_bytes = gzip.decompress(raw)
    assert layer.diff_id == _sha(tar_bytes)
    assert layer.blob.size >= 300_000  # random content does not compress
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        member = tar.getmember("data/blob")
        assert member.size == 300_000
    assert cache.random_layer(300_000, seed="t") == layer  # cached
    assert oci.BlobCache(tmp_path / "other").random_layer(300_000, seed="t").blob.digest == \
        layer.blob.digest  # reproducible
    assert cache.random_layer(300_000, seed="u").blob.digest != layer.blob.digest


def test_busybox_and_noshell_layers(tmp_path: Path) -> None:
    cache = oci.BlobCache(tmp_path)
    names = tarfile.open(fileobj=io.BytesIO(gzip.decompress(
        cache.busybox_layer().blob.read()))).getnames()
    assert "bin/busybox" in names and "bin/sh" in names
    img = oci.no_shell_image(cache)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(img.layers[0].blob.read()))) as t:
        names = t.getnames()
        assert t.getmember("app").size == oci.BUSYBOX.stat().st_size
    assert "app" in names and not any(n.endswith(("sh", "tar")) for n in names)


def test_manifest_config_index(tmp_path: Path) -> None:
    cache = oci.BlobCache(tmp_path)
    layers = [cache.random_layer(1000, seed="a"), cache.random_layer(2000, seed="b")]
    img = oci.build_image(layers, arch="arm64", cmd=["x"])
    m = json.loads(img.manifest.read())
    assert m["config"]["digest"] == img.config_digest == _sha(img.config.read())
    assert [la["digest"] for la in m["layers"]] == [la.blob.digest for la in layers]
    cfg = json.loads(img.config.read())
    assert cfg["rootfs"]["diff_ids"] == [la.diff_id for la in layers]
    assert (cfg["os"], cfg["architecture"]) == ("linux", "arm64")
    idx = oci.build_index([oci.build_image(layers[:1]), img])
    body = json.loads(idx.index.read())
    assert [d["platform"]["architecture"] for d in body["manifests"]] == ["amd64", "arm64"]
    assert idx.for_platform("linux", "arm64") is img


def test_push_and_fetch_back(registry: Registry, oci_cache: oci.BlobCache) -> None:
    img = oci.build_image([oci_cache.random_layer(2 << 20, seed="push")])
    oci.push_image(registry.host, "t/push", img, "v1")
    oci.push_image(registry.host, "t/push", img, "v1")  # existing blobs are skipped
    req = urllib.request.Request(f"{registry.url}/v2/t/push/manifests/v1",
                                 headers={"Accept": oci.MEDIA_MANIFEST})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Docker-Content-Digest"] == img.digest
    blob = img.layers[0].blob
    with urllib.request.urlopen(f"{registry.url}/v2/t/push/blobs/{blob.digest}") as r:
        assert _sha(r.read()) == blob.digest
