"""ThrottleProxy limits bandwidth, pauses, and can play a registry going down."""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path

import pytest

from tests.framework import oci
from tests.framework.node import throttle_for
from tests.framework.registry import Registry
from tests.framework.throttle import ThrottleProxy

MiB = 1024 * 1024


def _fetch(host: str, path: str) -> bytes:
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def blob(registry: Registry, oci_cache: oci.BlobCache) -> tuple[str, oci.Blob]:
    img = oci.build_image([oci_cache.random_layer(2 * MiB, seed="throttle")])
    oci.push_image(registry.host, "t/throttle", img, "1")
    b = img.layers[0].blob
    return f"/v2/t/throttle/blobs/{b.digest}", b


def test_rate_limit_and_change(registry: Registry, blob: tuple[str, oci.Blob]) -> None:
    path, b = blob
    with ThrottleProxy(registry.host, rate=4 * MiB) as proxy:
        t = time.monotonic()
        assert len(_fetch(proxy.host, path)) == b.size
        slow = time.monotonic() - t
        assert slow >= 0.4, f"2 MiB at 4 MiB/s took {slow:.2f} s"  # lower bound only
        proxy.set_rate(None)
        assert len(_fetch(proxy.host, path)) == b.size
        assert proxy.bytes_down >= 2 * b.size


def test_pause_resume(registry: Registry, blob: tuple[str, oci.Blob]) -> None:
    path, b = blob
    with ThrottleProxy(registry.host, rate=8 * MiB) as proxy:
        got: list[bytes] = []
        proxy.pause()
        th = threading.Thread(target=lambda: got.append(_fetch(proxy.host, path)))
        th.start()
        time.sleep(0.5)
        assert proxy.bytes_down == 0 and th.is_alive()
        proxy.resume()
        th.join(10)
        assert got and len(got[0]) == b.size


def test_kill_and_revive(registry: Registry, blob: tuple[str, oci.Blob]) -> None:
    path, b = blob
    with ThrottleProxy(registry.host, rate=1 * MiB) as proxy:
        errors: list[BaseException] = []
        got: list[bytes] = []

        def fetch() -> None:
            try:
                got.append(_fetch(proxy.host, path))
            except (OSError, http.client.HTTPException) as e:
                errors.append(e)

        th = threading.Thread(target=fetch)
        th.start()
        time.sleep(0.5)
        proxy.kill()
        th.join(10)
        assert errors or (got and len(got[0]) < b.size), "transfer survived the kill"
        with pytest.raises(ConnectionRefusedError):
            _fetch(proxy.host, path)
        proxy.revive()
        proxy.set_rate(None)
        assert len(_fetch(proxy.host, path)) == b.size


def test_per_blob_rate(registry: Registry, blob: tuple[str, oci.Blob]) -> None:
    """A blob with its own rate is paced by it, even with no shared limit; clearing the
    per-blob rates makes it unlimited again."""
    path, b = blob
    with ThrottleProxy(registry.host) as proxy:
        proxy.set_blob_rates({b.digest: 4 * MiB, "sha256:" + "0" * 64: 1.0})
        t = time.monotonic()
        assert len(_fetch(proxy.host, path)) == b.size
        slow = time.monotonic() - t
        assert slow >= 0.4, f"2 MiB at 4 MiB/s took {slow:.2f} s"  # lower bound only
        proxy.set_blob_rates({b.digest: None})
        t = time.monotonic()
        assert len(_fetch(proxy.host, path)) == b.size
        assert time.monotonic() - t < slow


def test_blob_log_records_each_get_apart(registry: Registry, blob: tuple[str, oci.Blob]) -> None:
    """Two GETs of the blob on one keep-alive connection and a HEAD: two fetches in the
    log, each counting the body only (the response heads are not bytes of the blob), with
    times that rise and span what the rate allows."""
    path, b = blob
    with ThrottleProxy(registry.host, rate=8 * MiB) as proxy:
        conn = http.client.HTTPConnection(proxy.host, timeout=30)
        try:
            for method in ("GET", "HEAD", "GET"):
                conn.request(method, path)
                resp = conn.getresponse()
                body = resp.read()
                assert len(body) == (b.size if method == "GET" else 0)
        finally:
            conn.close()
        log = proxy.blob_log()
        assert list(log) == [b.digest]
        assert proxy.blob_log("sha256:" + "0" * 64) == {}
    fetches = log[b.digest]
    assert len(fetches) == 2
    for f in fetches:
        assert f.received == b.size
        mono = [s[0] for s in f.samples]
        offsets = [s[2] for s in f.samples]
        assert mono == sorted(mono) and offsets == sorted(offsets) and offsets[0] > 0
        # 2 MiB at 8 MiB/s: about 0.25 s between first and last byte (burst allowance aside).
        assert mono[-1] - mono[0] >= 0.15
    assert fetches[0].samples[-1][0] <= fetches[1].samples[0][0]


def test_throttle_for_is_trusted_by_every_containerd_given(
        registry: Registry, blob: tuple[str, oci.Blob], tmp_path: Path) -> None:
    """One throttle, the link of several nodes (bench_progress_accuracy --cluster): each
    node's containerd directory gets the proxy's hosts.toml while it runs, none after."""
    path, b = blob
    dirs = [tmp_path / "n1" / "containerd", tmp_path / "n2" / "containerd"]
    with throttle_for(registry.host, dirs, 8 * MiB) as proxy:
        for d in dirs:
            hosts = (d / "certs.d" / proxy.host / "hosts.toml").read_text()
            assert f'server = "http://{proxy.host}"' in hosts
            assert f'[host."http://{proxy.host}"]' in hosts
        assert len(_fetch(proxy.host, path)) == b.size
        assert [f.received for f in proxy.blob_log()[b.digest]] == [b.size]
    assert not any((d / "certs.d" / proxy.host).exists() for d in dirs)
