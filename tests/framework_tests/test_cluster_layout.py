"""The two-node cluster's address plan (tests.framework.cluster): every range it hands out
is its own, so instances, nodes and the single-node harness never overlap; node paths map
to the node's own directories. No namespaces are created here."""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest

from tests.framework.clusternode import ClusterNode, cluster_cidr
from tests.framework.controlplane import INSTANCES, SERVICE_CIDR, ControlPlane
from tests.framework.kubelet import pod_subnet
from tests.framework.nodens import BINDS, NodeNamespaces

Net = ipaddress.IPv4Network


def _cp(instance: str, tmp: Path) -> ControlPlane:
    return ControlPlane(instance=instance, state=tmp / instance)


def _nodes(cp: ControlPlane) -> list[ClusterNode]:
    return [ClusterNode(cp, k) for k in (1, 2)]


def test_ranges_are_disjoint_across_instances_and_nodes(tmp_path: Path) -> None:
    used: list[tuple[str, Net]] = [("services", Net(SERVICE_CIDR.split(",")[0]))]
    for inst in INSTANCES:
        cp = _cp(inst, tmp_path)
        used.append((f"{inst} bridge", Net(f"{cp.net.subnet}.0/24")))
        used.append((f"{inst} single-node pods", Net(pod_subnet(cp))))
        for n in _nodes(cp):
            pods = Net(n.pod_cidr)
            assert pods.subnet_of(Net(cluster_cidr(cp))), (n.name, pods)
            used.append((f"{inst} {n.name} pods", pods))
    for (a, na), (b, nb) in itertools.combinations(used, 2):
        assert not na.overlaps(nb), f"{a} {na} overlaps {b} {nb}"


def test_node_addresses_and_names(tmp_path: Path) -> None:
    for inst in INSTANCES:
        cp = _cp(inst, tmp_path)
        taken = {cp.net.host_address, cp.api_host.address, cp.node_host.address}
        nodes = _nodes(cp)
        addrs = [n.address for n in nodes]
        assert len(set(addrs)) == len(addrs) and not taken & set(addrs)
        bridge = Net(f"{cp.net.subnet}.0/24")
        for n in nodes:
            assert ipaddress.IPv4Address(n.address) in bridge
            # netns.Network.add names the host end of the veth "<netns>h": 15 chars at most.
            assert len(f"{n.host.netns}h") <= 15
        assert len({n.name for n in nodes}) == 2 and cp.node_name not in {n.name for n in nodes}
        assert len({n.info.cgroup_parent for n in nodes}) == 2


def test_node_paths_are_the_nodes_own(tmp_path: Path) -> None:
    cp = _cp("e2e", tmp_path)
    a, b = _nodes(cp)
    assert a.ns.path("/var/lib/kubelet/config.yaml") == a.dir / "kubelet/config.yaml"
    assert a.kubelet.config_path == a.ns.path("/var/lib/kubelet/config.yaml")
    assert Path(a.cri_address) == a.dir / "run-containerd/containerd.sock"
    for inside in BINDS:
        assert a.ns.path(inside) != b.ns.path(inside)
        assert a.ns.path(inside).is_relative_to(a.dir)
    for outside in ("/etc/passwd", "/var/lib/kubeletx", "/run"):
        with pytest.raises(ValueError):
            a.ns.path(outside)


def test_kubelet_config_names_node_paths(tmp_path: Path) -> None:
    """The config the agent reads (/proc/1/root/var/lib/kubelet/config.yaml) speaks of
    the node's paths, and the node's own address and CRI socket."""
    cp = _cp("e2e", tmp_path)
    n = _nodes(cp)[1]
    cfg = n.kubelet.config()
    assert cfg["address"] == n.address
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert cfg["tlsCertFile"] == "/var/lib/kubelet/pki/kubelet.crt"
    assert cfg["cgroupRoot"] == n.info.cgroup_parent
    cni = n.kubelet.cni_config()["plugins"][0]
    assert cni["ipam"]["ranges"][0][0]["subnet"] == n.pod_cidr
    assert cni["isGateway"] and not cni["ipMasq"]


def test_namespaces_object_needs_no_running_node(tmp_path: Path) -> None:
    cp = _cp("e2e", tmp_path)
    ns = NodeNamespaces(cp.net, cp.net.host("n1", 11), tmp_path / "n1", tmp_path, "node1")
    assert not ns.alive()
    with pytest.raises(RuntimeError):
        ns.exec_prefix()
