"""tests.framework.containerd: own paths only, and stop() cleans up even when a test
left a pod running."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.framework.containerd import SHIM_SOCKET_DIR, Containerd
from tests.framework.pods import ContainerSpec, PodRunner
from tests.framework.registry import Registry


def test_config_uses_own_paths(tmp_path: Path) -> None:
    ctd = Containerd(tmp_path, sandbox_image="127.0.0.1:1/pause:1")
    text = ctd.config_text()
    assert "/var/lib/containerd" not in text and "/run/containerd" not in text
    assert f'address = "{tmp_path}/containerd.sock"' in text
    assert "restrict_oom_score_adj = true" in text
    ctd.add_registry("127.0.0.1:5123")
    hosts = (tmp_path / "certs.d/127.0.0.1:5123/hosts.toml").read_text()
    assert 'server = "http://127.0.0.1:5123"' in hosts


async def test_stop_cleans_up_leftovers(registry: Registry, pause_image: str,
                                        busybox_image: str) -> None:
    ctd = Containerd(sandbox_image=pause_image)
    ctd.add_registry(registry.host)
    ctd.start()
    try:
        async with ctd.cri_client() as cri:
            runner = PodRunner(cri, cgroup_parent=ctd.cgroup_parent,
                               log_root=ctd.workdir / "pods")
            pod = await runner.run_pod("leftover", [ContainerSpec("c", busybox_image)])
            st = await cri.container_status(pod.containers["c"])
            assert st is not None and st.pid
        shims = ctd.shim_pids()
        assert shims and pod.sandbox_id in shims.values()
        sockets = [ctd._shim_socket(t) for t in shims.values()]
        assert all(await asyncio.gather(*(asyncio.to_thread(s.exists) for s in sockets)))
    finally:
        await asyncio.to_thread(ctd.stop)  # without removing the pod first
    await asyncio.to_thread(_assert_clean, ctd, [*shims, st.pid], sockets)


def _assert_clean(ctd: Containerd, pids: list[int], sockets: list[Path]) -> None:
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not any(s.exists() for s in sockets)
    with open("/proc/self/mountinfo") as f:
        assert str(ctd.workdir) not in f.read()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{ctd.cgroup_parent.lstrip('/')}"))
    assert not ctd.workdir.exists()
    if SHIM_SOCKET_DIR.exists():
        assert not set(os.listdir(SHIM_SOCKET_DIR)) & {s.name for s in sockets}
