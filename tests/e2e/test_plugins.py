"""The kubectl plugins through real kubectl against the real control plane.

kubectl finds ``kubectl-ncp`` and ``kubectl-image_pull_progress`` on PATH (launchers of
the console-script entry points). RBAC and a missing pod need only the control plane and
aggapi's apiserver. Copies and pulls need a running pod on the harness node; they use
these fixtures when tests/e2e/conftest.py provides them, and skip otherwise:

- ``workload_pod``: a Pod object bound to the node whose container runs under the agent,
  with attributes ``namespace``, ``name`` and ``container`` (a writable /tmp inside);
  user alice may use pods/copy on it (copies also need create on pods/exec).
- ``pulling_pod``: like it, but its image is still being pulled slowly (the throttle
  proxy), so progress can be watched; attributes ``namespace`` and ``name``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.framework.controlplane import ControlPlane
from tests.framework.procs import Proc
from tests.plugins.helpers import (
    KUBECTL,
    install_plugins,
    kubectl,
    kubectl_pty,
    plugin_env,
    screen_text,
)


def _optional(request: pytest.FixtureRequest, name: str) -> Any:
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"fixture {name!r} is not provided by tests/e2e/conftest.py yet")


@pytest.fixture(scope="module")
def plugin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugins") / "bin"
    install_plugins(d)
    return d


def env_for(cp: ControlPlane, bin_dir: Path, user: str) -> dict[str, str]:
    return plugin_env(bin_dir, cp.user_kubeconfig(user))


@pytest.fixture
def workload(request: pytest.FixtureRequest) -> Any:
    return _optional(request, "workload_pod")


def remote(pod: Any, path: str) -> str:
    return f"{pod.namespace}/{pod.name}:{path}"


# --- needs only kube-apiserver (+ aggapi for the 404) -----------------------------------

async def test_rbac_denial_comes_from_kube_apiserver(control_plane: ControlPlane,
                                                     plugin_bin: Path, tmp_path: Path) -> None:
    env = env_for(control_plane, plugin_bin, "mallory")
    r = await kubectl(env, "ncp", "-c", "c", "default/web:/etc/hostname", str(tmp_path / "x"))
    assert r.rc == 1
    assert "Error from server (Forbidden)" in r.err
    assert 'User "mallory" cannot watch resource "pods/copy" in API group ' \
           '"subresources.aggapi.io"' in r.err
    r = await kubectl(env, "image-pull-progress", "web", "-n", "default")
    assert r.rc == 1
    assert 'cannot watch resource "pods/imagepullprogress"' in r.err
    assert os.listdir(tmp_path) == []


async def test_missing_pod_gives_servers_message(control_plane: ControlPlane,
                                                 aggapi_apiserver: Proc, plugin_bin: Path,
                                                 tmp_path: Path) -> None:
    env = env_for(control_plane, plugin_bin, "alice")
    r = await kubectl(env, "ncp", "default/no-such-pod:/etc/hostname", str(tmp_path / "x"))
    assert r.rc == 1 and 'pods "no-such-pod" not found' in r.err, r.err
    r = await kubectl(env, "image-pull-progress", "no-such-pod", "-n", "default")
    assert r.rc == 1 and 'pods "no-such-pod" not found' in r.err, r.err


async def test_completion_and_impersonation_against_kube_apiserver(
        control_plane: ControlPlane, aggapi_apiserver: Proc, plugin_bin: Path) -> None:
    """kubectl's plugin completion lists pods and containers from the real API (alice may
    list pods), and --as makes kube-apiserver judge the impersonated user."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "e2e-complete", "namespace": "default",
                        "annotations": {"kubectl.kubernetes.io/default-container": "side"}},
           "spec": {"nodeName": "no-such-node",  # never runs: only listed
                    "containers": [{"name": "app", "image": "busybox"},
                                   {"name": "side", "image": "busybox"}]}}
    control_plane.apply([pod])
    env = env_for(control_plane, plugin_bin, "alice")
    r = await kubectl(env, "__complete", "ncp", "-n", "default", "e2e-com")
    assert r.rc == 0 and r.out.splitlines() == ["e2e-complete:", ":2"], (r.out, r.err)
    r = await kubectl(env, "__complete", "image-pull-progress", "e2e-complete", "-c", "")
    assert r.out.splitlines() == ["app", "side", ":4"], (r.out, r.err)
    r = await kubectl(env, "__complete", "image-pull-progress", "--as", "mallory", "e2e")
    assert r.out.splitlines() == [":4"], r.out  # alice may not impersonate: nothing offered
    admin = plugin_env(plugin_bin, control_plane.admin_kubeconfig)
    r = await kubectl(admin, "image-pull-progress", "--as", "mallory", "-n", "default",
                      "e2e-complete")
    assert r.rc == 1 and 'User "mallory" cannot watch resource "pods/imagepullprogress"' \
        in r.err, r.err
    r = await kubectl(admin, "image-pull-progress", "-v=6", "--as", "mallory",
                      "--request-timeout=20s", "-n", "default", "e2e-complete")
    assert re.search(r"\] GET https://\S+/imagepullprogress\S* 403 Forbidden in \d+ "
                     r"milliseconds", r.err), r.err


# --- needs a running pod ------------------------------------------------------------------

def make_tree(root: Path) -> None:
    (root / "a/b").mkdir(parents=True)
    (root / "a/b/c.txt").write_text("deep\n")
    (root / "top.bin").write_bytes(os.urandom(1 << 20))
    (root / "empty").write_bytes(b"")
    os.symlink("a/b/c.txt", root / "link")


def digest_tree(root: Path) -> dict[str, str]:
    out = {}
    for cur, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(cur, n)
            rel = str(p.relative_to(root))
            out[rel] = ("->" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir()
                        else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


async def test_directory_copy_both_ways(control_plane: ControlPlane, aggapi_apiserver: Proc,
                                        plugin_bin: Path, workload: Any,
                                        tmp_path: Path) -> None:
    env = env_for(control_plane, plugin_bin, "alice")
    src = tmp_path / "tree"
    make_tree(src)
    r = await kubectl(env, "ncp", "-c", workload.container, str(src),
                      remote(workload, "/tmp/e2e-tree"))
    assert r.rc == 0, r.err
    back = tmp_path / "back"
    r = await kubectl(env, "ncp", "-c", workload.container, remote(workload, "/tmp/e2e-tree"),
                      str(back))
    assert r.rc == 0, r.err
    assert digest_tree(back) == digest_tree(src)


async def test_directory_upload_no_preserve(control_plane: ControlPlane,
                                            aggapi_apiserver: Proc, plugin_bin: Path,
                                            workload: Any, tmp_path: Path) -> None:
    """Like kubectl cp: the local modes go into the container by default, and with
    --no-preserve the entries get the container's defaults (0644, 0755). Read back
    with a (mode-preserving) download."""
    env = env_for(control_plane, plugin_bin, "alice")
    src = tmp_path / "modes"
    (src / "sub").mkdir(parents=True)
    (src / "sub/run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "sub/run.sh").chmod(0o700)
    (src / "sub").chmod(0o750)
    modes = {}
    for flags, name in (((), "kept"), (("--no-preserve",), "plain")):
        r = await kubectl(env, "ncp", *flags, "-c", workload.container, str(src),
                          remote(workload, f"/tmp/e2e-modes-{name}"))
        assert r.rc == 0, r.err
        back = tmp_path / f"back-{name}"
        r = await kubectl(env, "ncp", "-c", workload.container,
                          remote(workload, f"/tmp/e2e-modes-{name}"), str(back))
        assert r.rc == 0, r.err
        modes[name] = ((back / "sub").stat().st_mode & 0o777,
                       (back / "sub/run.sh").stat().st_mode & 0o777)
    assert modes == {"kept": (0o750, 0o700), "plain": (0o755, 0o644)}, modes


async def test_relative_path_starts_at_the_containers_cwd(
        control_plane: ControlPlane, aggapi_apiserver: Proc, plugin_bin: Path, workload: Any,
        tmp_path: Path) -> None:
    """busybox's working directory is /: "tmp/x" is /tmp/x, and '..' stops at the root."""
    env = env_for(control_plane, plugin_bin, "alice")
    (tmp_path / "rel").write_bytes(b"relative upload")
    r = await kubectl(env, "ncp", "-c", workload.container, str(tmp_path / "rel"),
                      remote(workload, "tmp/e2e-rel"))
    assert r.rc == 0, r.err
    r = await kubectl(env, "ncp", "-c", workload.container,
                      remote(workload, "../../../tmp/e2e-rel"), str(tmp_path / "back"))
    assert r.rc == 0, r.err
    assert (tmp_path / "back").read_bytes() == b"relative upload"


async def test_interrupted_download_is_resumed(control_plane: ControlPlane,
                                               aggapi_apiserver: Proc, plugin_bin: Path,
                                               workload: Any, tmp_path: Path) -> None:
    env = env_for(control_plane, plugin_bin, "alice")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(16 << 20))
    r = await kubectl(env, "ncp", "-c", workload.container, str(big),
                      remote(workload, "/tmp/e2e-big.bin"))
    assert r.rc == 0, r.err
    dest = tmp_path / "dl" / "big.bin"
    dest.parent.mkdir()
    partial = dest.with_name(".big.bin.ncp-partial")
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "ncp", "--limit-rate=2M", "-c", workload.container,
        remote(workload, "/tmp/e2e-big.bin"), str(dest), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    for _ in range(300):
        await asyncio.sleep(0.05)
        if partial.exists() and partial.stat().st_size > (2 << 20):
            break
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    kept = partial.stat().st_size
    assert 0 < kept < big.stat().st_size and not dest.exists()
    r = await kubectl(env, "ncp", "-c", workload.container,
                      remote(workload, "/tmp/e2e-big.bin"), str(dest))
    assert r.rc == 0, r.err
    assert f"resumed at {kept} bytes" in r.err
    assert dest.read_bytes() == big.read_bytes()


async def test_wrong_container_and_path(control_plane: ControlPlane, aggapi_apiserver: Proc,
                                        plugin_bin: Path, workload: Any,
                                        tmp_path: Path) -> None:
    env = env_for(control_plane, plugin_bin, "alice")
    r = await kubectl(env, "ncp", "-c", "no-such-container",
                      remote(workload, "/etc/hostname"), str(tmp_path / "x"))
    assert r.rc == 1 and "Error from server" in r.err and "no-such-container" in r.err, r.err
    r = await kubectl(env, "ncp", "-c", workload.container,
                      remote(workload, "/no/such/path"), str(tmp_path / "x"))
    assert r.rc == 1 and "Error from server (NotFound)" in r.err, r.err
    assert "/no/such/path" in r.err
    assert os.listdir(tmp_path) == []


async def test_image_pull_progress_of_a_running_pod(control_plane: ControlPlane,
                                                    aggapi_apiserver: Proc, plugin_bin: Path,
                                                    workload: Any) -> None:
    env = env_for(control_plane, plugin_bin, "alice")
    r = await kubectl(env, "image-pull-progress", workload.name, "-n", workload.namespace,
                      "-o", "json")
    assert r.rc == 0, r.err
    last = json.loads(r.out.splitlines()[-1])
    assert last["kind"] == "Summary"
    assert all(i["phase"] in ("Done", "AlreadyPresent") for i in last["images"])


async def test_pull_rendered_on_a_terminal(control_plane: ControlPlane, aggapi_apiserver: Proc,
                                           plugin_bin: Path,
                                           request: pytest.FixtureRequest) -> None:
    pod = _optional(request, "pulling_pod")
    env = env_for(control_plane, plugin_bin, "alice")
    r = await kubectl_pty(env, "image-pull-progress", pod.name, "-n", pod.namespace,
                          timeout=300)
    assert r.rc == 0, r.out[-2000:]
    screen = screen_text(r.out)
    assert "━" in screen
    totals = [int(m) for m in re.findall(r"total\s.*?(\d+)%", screen)]
    # Not asserted monotonic: the aggregate's total grows as layers are discovered.
    assert len(set(totals)) >= 3 and totals[-1] == 100, totals
