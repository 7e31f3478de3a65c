"""A harness node as it is on disk (``<control plane state>/node/``), and its teardown.

Kept apart from tests.framework.node so that the control plane's ``down`` can take down a
node it did not start (``hack/local-down.sh`` runs in another process) with no import of
the node module, which itself builds on the control plane. It needs paths and pidfiles
only: the state directory, ``node.json`` and the processes' ``pids/`` entries.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.framework.containerd import Containerd
from tests.framework.procs import Proc

# The agent's process name in the control plane's state (ControlPlane.start_agent).
AGENT_PROC = "aggapi-agent"
# The node's own processes; their pidfiles are "node-<name>".
NODE_PROCS = ("registry", "throttle", "authregistry", "containerd")


@dataclass
class NodeInfo:
    """node.json: what a process needs to use, or stop, a node another one started."""

    registry_host: str = ""
    throttle_host: str = ""
    # The release registry (htpasswd auth; hack/release.sh pushes there) and its one user.
    auth_registry_host: str = ""
    auth_registry_user: str = ""
    auth_registry_password: str = ""
    containerd_dir: str = ""
    cgroup_parent: str = ""
    sandbox_image: str = ""
    snapshotter: str = ""
    images: dict[str, Any] = field(default_factory=dict)

    def registry_hosts(self) -> tuple[str, ...]:
        """Every registry a node's containerd pulls from (plain HTTP)."""
        return tuple(h for h in (self.registry_host, self.throttle_host,
                                 self.auth_registry_host) if h)


def node_dir(state: Path) -> Path:
    return state / "node"


def info_path(state: Path) -> Path:
    return node_dir(state) / "node.json"


def has_node(state: Path) -> bool:
    return info_path(state).exists()


def load_info(state: Path) -> NodeInfo:
    return NodeInfo(**json.loads(info_path(state).read_text()))


def save_info(state: Path, info: NodeInfo) -> None:
    info_path(state).write_text(json.dumps(asdict(info), indent=2) + "\n")


def node_proc(state: Path, what: str) -> Proc:
    return Proc.named(state, f"node-{what}")


def containerd_of(state: Path, info: NodeInfo) -> Containerd:
    """A Containerd object for the node's containerd (to clean up after it)."""
    ctd = Containerd(info.containerd_dir or node_dir(state) / "containerd",
                     sandbox_image=info.sandbox_image, snapshotter=info.snapshotter or "native")
    if info.cgroup_parent:
        ctd.cgroup_parent = info.cgroup_parent
    return ctd


def _stop_containerd(ctd: Containerd, proc: Proc) -> None:
    # Containers first (runc delete, kill what is left in our cgroups), then the
    # daemon by PID, then shims, mounts and cgroups: Containerd.stop() with proc=None.
    ctd._delete_runc_containers()
    ctd._kill_cgroup_procs()
    popen, ctd.proc = ctd.proc, None  # may not be our child: stop it by PID
    proc.stop()
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(5)
    ctd.stop()


def teardown(state: Path, *, info: NodeInfo | None = None,
             containerd: Containerd | None = None) -> None:
    """Stop the agent, containerd (and clean up its containers, shims, mounts and
    cgroups), the throttle proxy and the registry; remove the node directory.

    ``info`` and ``containerd`` are the in-process ones of the node that started them,
    if any; otherwise node.json says what to clean up. Safe to run twice."""
    Proc.named(state, AGENT_PROC).stop()
    if (info is None or not info.containerd_dir) and has_node(state):
        info = load_info(state)
    if info is not None and info.containerd_dir:
        _stop_containerd(containerd or containerd_of(state, info), node_proc(state, "containerd"))
    else:
        node_proc(state, "containerd").stop()
    for what in ("throttle", "authregistry", "registry"):
        node_proc(state, what).stop()
    shutil.rmtree(node_dir(state), ignore_errors=True)
