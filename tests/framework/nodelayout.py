"""The harness node's names: binaries, image references, its directory and processes, the
state saved in node.json (tests.framework.node builds on this)."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.framework import nodestate
from tests.framework.containerd import Containerd
from tests.framework.controlplane import ControlPlane
from tests.framework.nodestate import NodeInfo
from tests.framework.procs import HarnessError, Proc, wait_ready
from tests.framework.repo import REPO

REGISTRY_BIN = "/usr/bin/docker-registry"
NEEDED = ["/usr/bin/containerd", "/usr/sbin/runc", REGISTRY_BIN, "/bin/busybox"]
BIG_LAYER = 150 * 1024 * 1024
OCI_CACHE = REPO / ".local/oci-cache"
MiB = 1 << 20


def log(msg: str) -> None:
    print(f"node: {msg}", file=sys.stderr, flush=True)


def ensure_runtime_deps() -> None:
    """hack/install-deps.sh if containerd, runc, the registry or busybox is missing."""
    if all(Path(b).exists() for b in NEEDED):
        return
    subprocess.run(["bash", str(REPO / "hack/install-deps.sh")], check=True)
    missing = [b for b in NEEDED if not Path(b).exists()]
    if missing:
        raise HarnessError(f"still missing after hack/install-deps.sh: {missing}")


@dataclass(frozen=True)
class Images:
    """Image references as pods name them. ``big`` has no host: pull it through the
    proxy (``node.via_throttle(node.images.big)``) to watch it, or the registry."""

    pause: str
    busybox: str
    noshell: str
    big: str  # repository:tag, ~150 MB: busybox base + 3 random layers
    big_layers: tuple[tuple[str, int], ...] = ()  # (digest, size) of big's layers


class NodeLayout:
    """What every part of a harness node (tests.framework.node.Node) names."""

    def __init__(self, cp: ControlPlane, *, cache_dir: Path = OCI_CACHE,
                 big_layer: int = BIG_LAYER) -> None:
        self.cp = cp
        # Where the registry and the throttle proxy listen: reachable from every netns.
        self.bind = cp.net.host_address
        self.dir = nodestate.node_dir(cp.state)
        self.cache_dir = cache_dir
        self.big_layer = big_layer
        self.info = NodeInfo()
        self.containerd: Containerd | None = None

    # --- names ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.cp.node_name

    @property
    def cri_address(self) -> str:
        return str(Path(self.info.containerd_dir) / "containerd.sock")

    @property
    def images(self) -> Images:
        d = dict(self.info.images)
        d["big_layers"] = tuple(tuple(x) for x in d.get("big_layers", ()))
        return Images(**d)

    def via_registry(self, repo: str) -> str:
        return f"{self.info.registry_host}/{repo}"

    def via_throttle(self, repo: str) -> str:
        return f"{self.info.throttle_host}/{repo}"

    @property
    def pods_dir(self) -> Path:
        return self.dir / "pods"

    def proc(self, what: str) -> Proc:
        return nodestate.node_proc(self.cp.state, what)

    def _save(self) -> None:
        nodestate.save_info(self.cp.state, self.info)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait(ok: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
    wait_ready(ok, timeout, what, proc, poll=0.05)

