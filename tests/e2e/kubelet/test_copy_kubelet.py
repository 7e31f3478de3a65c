"""pods/copy into a container a real kubelet started from a distroless-like image (no
shell, no tar): our copy works, ``kubectl cp`` (kubelet exec streaming + tar) fails."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.kubelet.conftest import create_pods, delete_pods, pod, wait_running
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node
from tests.framework.repo import REPO


def _ncp(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggapi.plugins.ncp", "-q",
                           f"--kubeconfig={cp.admin_kubeconfig}", *args], text=True,
                          capture_output=True, timeout=120, cwd=REPO)


def test_copy_into_no_shell_container(control_plane: ControlPlane, node: Node,
                                      real_node: Kubelet, tmp_path: Path) -> None:
    cp = control_plane
    create_pods(cp, [pod(node, "knoshell", [{"name": "app", "image": node.images.noshell}])])
    wait_running(cp, "knoshell")
    src = tmp_path / "up.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)

    up = _ncp(cp, str(src), "default/knoshell:/data/up.bin")
    assert up.returncode == 0, up.stderr
    back = tmp_path / "back.bin"
    down = _ncp(cp, "default/knoshell:/data/up.bin", str(back))
    assert down.returncode == 0, down.stderr
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()

    # kubectl cp gets as far as kubelet's exec and fails for want of tar in the image.
    # It sends a small file: kube-apiserver ends the exec's stream as soon as the exec
    # fails, and stdin it has not read yet at that moment makes its kernel answer with a
    # TCP reset instead of a close, so kubectl loses the exec's status ("connection reset
    # by peer", or a websocket "close 1006 (abnormal closure)"). With 3 MiB still being
    # sent that happened now and then (the fresh-clone CI at e4f4003); a file that fits in
    # one write leaves nothing unread. A status lost anyway is asked for again.
    small = tmp_path / "small.bin"
    small.write_bytes(data[:1024])
    said = []
    for _ in range(3):
        kcp = subprocess.run([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "cp",
                              str(small), "default/knoshell:/data/kcp.bin"], text=True,
                             capture_output=True, timeout=120)
        if "tar" in kcp.stderr and "executable file not found" in kcp.stderr:
            break
        said.append(f"exit {kcp.returncode}: {kcp.stderr.strip()}")
    else:
        raise AssertionError("kubectl cp never named the missing tar:\n" + "\n".join(said))
    # Whatever kubectl said, the proof is that the file never arrived.
    gone = _ncp(cp, "default/knoshell:/data/kcp.bin", str(tmp_path / "kcp.bin"))
    assert gone.returncode != 0 and not (tmp_path / "kcp.bin").exists()
    assert "no such file or directory" in gone.stderr, gone.stderr
    delete_pods(cp, "knoshell")
