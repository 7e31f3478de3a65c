"""Network namespaces on a private bridge, so aggapi and its agent get addresses of their own.

Why: kube-apiserver refuses loopback addresses in Endpoints and EndpointSlices
(``must not be in the loopback range``), and with ``--enable-aggregator-routing`` the
aggregator dials the endpoint address itself. So each local "host" (the aggapi apiserver,
the node agent) lives in its own namespace with a veth into one host bridge:

    host:   bridge <prefix>br  10.251.N.1/24   (kube-apiserver binds here)
    netns   <prefix>api        10.251.N.2/24   (aggapi apiserver)
    netns   <prefix>node       10.251.N.3/24   (aggapi agent: a node)

There is no default route anywhere in the namespaces and the host only gains the connected
route of the bridge subnet: traffic stays on this machine. ``ip netns exec`` changes the
network namespace only, so processes inside still see the host's files, sockets and PIDs
(what a privileged, hostPID agent sees on a real node).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, text=True, capture_output=True)


def link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name, check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


@dataclass(frozen=True)
class Host:
    """One network namespace attached to the bridge."""

    netns: str
    address: str  # without prefix length

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]


@dataclass(frozen=True)
class Network:
    """A bridge ``<prefix>br`` with gateway ``<subnet>.1/24`` and namespaces on it."""

    prefix: str  # short: interface names are at most 15 characters
    subnet: str  # first three octets, e.g. "10.251.0"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def host(self, name: str, octet: int) -> Host:
        return Host(netns=f"{self.prefix}{name}", address=f"{self.subnet}.{octet}")

    def setup_bridge(self) -> None:
        if not link_exists(self.bridge):
            ip("link", "add", self.bridge, "type", "bridge")
        have = ip("-o", "-4", "addr", "show", "dev", self.bridge).stdout
        if f" {self.host_address}/" not in have:
            ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add(self, host: Host) -> None:
        """Create the namespace and its veth into the bridge (idempotent)."""
        self.setup_bridge()
        if not netns_exists(host.netns):
            ip("netns", "add", host.netns)
        outer = f"{host.netns}h"[-15:]
        if not link_exists(outer):
            ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")
        nx = ["netns", "exec", host.netns, "ip"]
        have = ip(*nx, "-o", "-4", "addr", "show", "dev", "eth0").stdout
        if f" {host.address}/" not in have:
            ip(*nx, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip(*nx, "link", "set", "eth0", "up")
        ip(*nx, "link", "set", "lo", "up")

    def remove(self, host: Host) -> None:
        if netns_exists(host.netns):
            # Deleting the namespace destroys its veth end, and with it the host end.
            ip("netns", "del", host.netns, check=False)
        outer = f"{host.netns}h"[-15:]
        if link_exists(outer):
            ip("link", "del", outer, check=False)

    def teardown(self, hosts: list[Host]) -> None:
        for h in hosts:
            self.remove(h)
        if link_exists(self.bridge):
            ip("link", "del", self.bridge, check=False)
