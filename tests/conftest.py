"""Shared fixtures: real containerd + runc, docker-registry, test images, a throttling
proxy and a kubelet stand-in. Costly things are session-scoped and synchronous
(subprocesses, files), so tests on any event loop can share them; gRPC clients
are per test. Tests using them are auto-marked ``integration``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aggapi.apiserver.collections import kubepart
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from tests.framework import oci
from tests.framework.containerd import Containerd
from tests.framework.pods import PodRunner
from tests.framework.registry import Registry
from tests.framework.repo import REPO
from tests.framework.throttle import ThrottleProxy

NEEDED = ["/usr/bin/containerd", "/usr/sbin/runc", "/usr/bin/docker-registry", "/bin/busybox"]
BIG_LAYER = 150 * 1024 * 1024
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())

INTEGRATION_FIXTURES = {
    "runtime_deps", "registry", "containerd", "cri", "ctd", "pods", "throttle",
    "busybox_image", "noshell_image", "big_image", "shared_images", "multiarch_image",
    "pause_image", "clean_images",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _forget_kube_parts() -> None:
    """Each test's fake kube-apiserver numbers versions from 1 again, and the fakes name
    uids after pods: what builds remember of one test's pods must not serve the next's
    (a process serves one cluster, where a uid and resourceVersion name one content)."""
    kubepart.forget()


@pytest.fixture(scope="session")
def plugin_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin archives and krew manifests from hack/build-plugins.sh (built once)."""
    from tests.plugins import release

    return release.build(tmp_path_factory.mktemp("plugin-release"))


@pytest.fixture(scope="session")
def runtime_deps() -> None:
    """Install the Debian packages if a binary is missing (hack/install-deps.sh)."""
    if all(Path(b).exists() for b in NEEDED):
        return
    subprocess.run(["bash", str(REPO / "hack/install-deps.sh")], check=True)
    missing = [b for b in NEEDED if not Path(b).exists()]
    if missing:
        pytest.fail(f"still missing after hack/install-deps.sh: {missing}")


@pytest.fixture(scope="session")
def oci_cache(tmp_path_factory: pytest.TempPathFactory) -> oci.BlobCache:
    """Built layers, kept for the session so the 150 MB layer is built once."""
    return oci.BlobCache(tmp_path_factory.mktemp("oci-cache"))


@pytest.fixture(scope="session")
def registry(runtime_deps: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def pause_image(registry: Registry, oci_cache: oci.BlobCache) -> str:
    oci.push_image(registry.host, "aggapi-test/pause", oci.pause_image(oci_cache), "1")
    return f"{registry.host}/aggapi-test/pause:1"


@pytest.fixture(scope="session")
def containerd(runtime_deps: None, registry: Registry, pause_image: str) -> Iterator[Containerd]:
    # Not under pytest's tmp dir: unix socket paths must stay < 108 bytes.
    ctd = Containerd(sandbox_image=pause_image)
    ctd.add_registry(registry.host)
    ctd.start()
    yield ctd
    ctd.stop()


@pytest.fixture(scope="session")
def busybox_image(registry: Registry, oci_cache: oci.BlobCache) -> str:
    """Runnable image (``/bin/busybox sleep 3600``); returns its reference."""
    oci.push_image(registry.host, "aggapi-test/busybox", oci.busybox_image(oci_cache), "1")
    return f"{registry.host}/aggapi-test/busybox:1"


@pytest.fixture(scope="session")
def noshell_image(registry: Registry, oci_cache: oci.BlobCache) -> str:
    """No /bin/sh, no tar: busybox as /app, run through a /sleep symlink."""
    oci.push_image(registry.host, "aggapi-test/noshell", oci.no_shell_image(oci_cache), "1")
    return f"{registry.host}/aggapi-test/noshell:1"


@dataclass(frozen=True)
class RepoImage:
    repo: str  # "aggapi-test/big:1", without host (to pull it through a proxy)
    image: oci.Image

    def ref(self, host: str) -> str:
        return f"{host}/{self.repo}"


@pytest.fixture(scope="session")
def big_image(registry: Registry, oci_cache: oci.BlobCache) -> RepoImage:
    """~150 MB in 4 layers (busybox base + 3 random), to watch a slow pull."""
    layers = [oci_cache.busybox_layer()] + [
        oci_cache.random_layer(n, seed=f"big-{i}")
        for i, n in enumerate((BIG_LAYER // 2, BIG_LAYER // 3, BIG_LAYER // 6))
    ]
    img = oci.build_image(layers, cmd=["/bin/busybox", "sleep", "3600"],
                          labels={"io.aggapi.test": "big"})
    oci.push_image(registry.host, "aggapi-test/big", img, "1")
    return RepoImage("aggapi-test/big:1", img)


@dataclass(frozen=True)
class SharedImages:
    base: oci.Layer
    a: RepoImage
    b: RepoImage


@pytest.fixture(scope="session")
def shared_images(registry: Registry, oci_cache: oci.BlobCache) -> SharedImages:
    """Two images whose first layer (8 MiB) is the same blob."""
    base = oci_cache.random_layer(8 << 20, seed="shared-base")
    out = []
    for name in ("a", "b"):
        img = oci.build_image([base, oci_cache.random_layer(1 << 20, seed=f"shared-{name}")],
                              labels={"io.aggapi.test": f"shared-{name}"})
        oci.push_image(registry.host, f"aggapi-test/shared-{name}", img, "1")
        out.append(RepoImage(f"aggapi-test/shared-{name}:1", img))
    return SharedImages(base, out[0], out[1])


@pytest.fixture(scope="session")
def multiarch_image(registry: Registry, oci_cache: oci.BlobCache) -> tuple[str, oci.Index]:
    """linux/amd64 + linux/arm64 index, each platform with its own layer."""
    images = [
        oci.build_image([oci_cache.random_layer(1 << 20, seed=f"multi-{arch}")], arch=arch,
                        labels={"io.aggapi.test": f"multi-{arch}"})
        for arch in ("amd64", "arm64")
    ]
    index = oci.build_index(images)
    oci.push_index(registry.host, "aggapi-test/multi", index, "1")
    return f"{registry.host}/aggapi-test/multi:1", index


@pytest.fixture
async def clean_images(containerd: Containerd) -> AsyncIterator[None]:
    """Every test starts and ends with no image but the sandbox's: deleted with
    containerd's synchronous garbage collection, so a later pull of the same content
    downloads again instead of finding it present (whatever an earlier test, or a
    module-scoped pod, pulled)."""

    async def purge() -> None:
        async with containerd.containerd_client() as ctd:
            for img in await ctd.list_images():
                if img.name != containerd.sandbox_image:
                    await ctd.delete_image(img.name, sync=True)

    await purge()
    yield
    await purge()


@pytest.fixture
async def cri(containerd: Containerd, clean_images: None) -> AsyncIterator[CRIClient]:
    async with containerd.cri_client() as client:
        yield client


@pytest.fixture
async def ctd(containerd: Containerd) -> AsyncIterator[ContainerdClient]:
    async with containerd.containerd_client() as client:
        yield client


@pytest.fixture
async def pods(containerd: Containerd, cri: CRIClient) -> AsyncIterator[PodRunner]:
    """Kubelet stand-in; removes every pod it ran at teardown."""
    runner = PodRunner(cri, cgroup_parent=containerd.cgroup_parent,
                       log_root=containerd.workdir / "pods")
    yield runner
    await runner.remove_all()


@pytest.fixture
def throttle(registry: Registry, containerd: Containerd) -> Iterator[ThrottleProxy]:
    """Proxy in front of the registry, unlimited until the test sets a rate.

    Pull ``f"{throttle.host}/repo:tag"`` to go through it.
    """
    proxy = ThrottleProxy(registry.host)
    proxy.start()
    containerd.add_registry(proxy.host)
    yield proxy
    proxy.stop()
    shutil.rmtree(containerd.hosts_dir / proxy.host, ignore_errors=True)
