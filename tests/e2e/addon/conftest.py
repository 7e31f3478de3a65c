"""e2e against aggapi installed with helm (tests.framework.addon): the installed add-on.

``installed_addon`` (session): the image loaded on every node, the harness's own aggapi
objects removed, ``helm install`` of manifests/charts/aggapi, everything Ready; ``helm
uninstall`` at the end. The cluster under it is ``addon_cluster``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.framework.addon import Addon, InstallTimes, NodeRuntime
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node
from tests.framework.repo import REPO


@dataclass
class AddonCluster:
    """The cluster the add-on is installed on: its nodes' runtimes and the chart values
    this cluster's layout needs."""

    cp: ControlPlane
    nodes: list[NodeRuntime]
    values: list[str] = field(default_factory=list)
    string_values: list[str] = field(default_factory=list)


@pytest.fixture(scope="session")
def addon_cluster(control_plane: ControlPlane, node: Node) -> Iterator[AddonCluster]:
    """One real kubelet in the host's network namespace (no pod routes, no kube-proxy):
    the add-on runs with hostNetwork and reaches kube-apiserver at its address."""
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "kubelet"], check=True)
    k = Kubelet(control_plane, node)
    k.start()
    sock = node.cri_address
    host, port = control_plane.server.removeprefix("https://").split(":")
    # One node, host network: a second replica would want the same host port.
    values = ["apiserver.replicas=1", "apiserver.hostNetwork=true", "agent.hostNetwork=true",
              f"agent.criSocketDir={os.path.dirname(sock)}",
              f"agent.criSocketName={os.path.basename(sock)}",
              f"agent.kubeletConfig={k.config_path}"]
    env = ["apiserver.extraEnv[0].name=KUBERNETES_SERVICE_HOST",
              f"apiserver.extraEnv[0].value={host}",
              "apiserver.extraEnv[1].name=KUBERNETES_SERVICE_PORT",
              f"apiserver.extraEnv[1].value={port}"]
    try:
        yield AddonCluster(control_plane, [NodeRuntime(control_plane.node_name, sock)],
                           values, env)
    finally:
        if k.proc().alive():
            k.delete_pods()
        k.stop()


@pytest.fixture(scope="session")
def installed_addon(addon_cluster: AddonCluster) -> Iterator[Addon]:
    c = addon_cluster
    addon = Addon(c.cp, c.nodes, values=list(c.values),
                  string_values=list(c.string_values))
    loaded = addon.load_image()
    addon.remove_harness_objects()
    times: InstallTimes = addon.install()
    print(f"\naddon: image loaded in {loaded:.1f}s; {times.line()}")
    addon.install_times = times  # type: ignore[attr-defined]
    try:
        yield addon
    finally:
        t0 = time.monotonic()
        addon.uninstall()
        print(f"\naddon: helm uninstall in {time.monotonic() - t0:.1f}s")
