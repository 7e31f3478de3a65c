"""The released plugins, as a user without aggapi installed runs them: the linux-amd64
archives from hack/build-plugins.sh unpacked onto PATH, run by real kubectl through the
zipapps' ``#!/usr/bin/env python3``, where python3 is an isolated interpreter (-I -S: no
site-packages, no PYTHONPATH) and HOME is empty. Against the real kube-apiserver, the
aggregated apiserver and an agent on the harness node.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.framework.controlplane import ControlPlane
from tests.framework.procs import Proc
from tests.plugins import release
from tests.plugins.helpers import KUBECTL, kubectl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def zipapp_bin(plugin_release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bin_dir = tmp_path_factory.mktemp("zipapps") / "bin"
    release.install_zipapps(plugin_release, bin_dir)
    (bin_dir / "kubectl").symlink_to(os.path.realpath(KUBECTL))
    return bin_dir


def user_env(cp: ControlPlane, bin_dir: Path, home: Path) -> dict[str, str]:
    return release.isolated_env(bin_dir, home, KUBECONFIG=str(cp.user_kubeconfig("alice")))


async def test_ncp_round_trip_from_the_zipapp(control_plane: ControlPlane,
                                              aggapi_apiserver: Proc, zipapp_bin: Path,
                                              workload_pod: Any, tmp_path: Path) -> None:
    env = user_env(control_plane, zipapp_bin, tmp_path / "home")
    r = await kubectl(env, "plugin", "list")
    assert f"{zipapp_bin}/kubectl-ncp" in r.out, r.out + r.err
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3 << 20))
    remote = f"{workload_pod.namespace}/{workload_pod.name}:/tmp/zipapp-payload.bin"
    r = await kubectl(env, "ncp", "-c", workload_pod.container, str(src), remote)
    assert r.rc == 0, r.err
    back = tmp_path / "back.bin"
    r = await kubectl(env, "ncp", "-c", workload_pod.container, remote, str(back))
    assert r.rc == 0, r.err
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(
        src.read_bytes()).digest()
    # The zipapp ran from its own unpacked copy under the temp HOME.
    assert any((tmp_path / "home/.shiv").glob("kubectl-ncp_*/site-packages/aggapi"))


async def test_image_pull_progress_from_the_zipapp(control_plane: ControlPlane,
                                                   aggapi_apiserver: Proc, zipapp_bin: Path,
                                                   workload_pod: Any, tmp_path: Path) -> None:
    env = user_env(control_plane, zipapp_bin, tmp_path / "home")
    r = await kubectl(env, "image-pull-progress", workload_pod.name, "-n",
                      workload_pod.namespace, "-o", "json")
    assert r.rc == 0, r.err
    last = json.loads(r.out.splitlines()[-1])
    assert last["kind"] == "Summary"
    assert last["images"] and all(i["phase"] in ("Done", "AlreadyPresent")
                                  for i in last["images"])
    r = await kubectl(env, "image-pull-progress", "no-such-pod", "-n", "default")
    assert r.rc == 1 and 'pods "no-such-pod" not found' in r.err, r.err
