"""Hollow agents, reached the way aggapi reaches real ones: the apiserver's own
AgentDirectory (EndpointSlices with nodeName, here from the fake kube-apiserver) and
AgentClient (mTLS with its client certificate, a signed capability per call), each
agent on its own port with its own serving certificate from aggapi's CA."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentDirectory
from aggapi.apiserver.imagepullprogress.nodeview import fetch_node_view
from aggapi.auth.capability import CapabilitySigner
from aggapi.status import StatusError
from aggapi.tls import certs
from tests.framework.fakekube import FakeKube
from tests.framework.hollow import Hollow, parser
from tests.framework.procs import free_port


async def _hollow(tmp: Path, nodes: list[str]) -> tuple[FakeKube, Hollow, AgentClient]:
    d = tmp / "certs"
    certs.generate(d, ips=["127.0.0.1"])
    kube = FakeKube()
    await kube.start()
    api = kube.kube_client()
    # Through the hollow process's own parser: its defaults (every flag) come along.
    args = parser().parse_args([
        "--kubeconfig=unused", f"--certs-dir={d}", f"--state={tmp}", "--address=127.0.0.1",
        "--base-port=0", f"--nodes={','.join(nodes)}", "--slots=2", "--seed=3",
        "--fail-fraction=0.0", "--back-off=1.0"])
    h = Hollow(api, args)
    for node in h.nodes.values():
        node.port = free_port()
    await h.start_agents()
    for node in h.nodes.values():  # what Hollow.publish applies (the fake has no apply)
        kube.put("apis/discovery.k8s.io/v1", "endpointslices", {
            "metadata": {"name": f"hollow-{node.name}", "namespace": "aggapi",
                         "labels": {"kubernetes.io/service-name": "aggapi-agent"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": node.name,
                           "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": node.port, "protocol": "TCP"}]})
    directory = AgentDirectory(api, namespace="aggapi", service="aggapi-agent",
                               pod_check=False)
    directory.start()
    await directory.wait_synced(5)
    client = AgentClient(directory, CapabilitySigner((d / "token-signing.key").read_bytes()),
                         ca_file=str(d / "ca.crt"), cert_file=str(d / "agent-client.crt"),
                         key_file=str(d / "agent-client.key"))
    return kube, h, client


async def test_each_hollow_agent_serves_its_own_nodes_pulls(tmp_path: Path) -> None:
    nodes = ["hollow-0", "hollow-1", "hollow-2"]
    kube, h, client = await _hollow(tmp_path, nodes)
    try:
        now = asyncio.get_running_loop().time()
        # Two pods on hollow-1 only: with 2 slots both pull at once.
        for i in range(2):
            h.nodes["hollow-1"].sim.request(("ns", f"p{i}", f"u{i}"),
                                            f"registry.scale.test/rollout/app-{i}:v1", now)
        h.nodes["hollow-1"].sim.tick(now)
        views = {n: await fetch_node_view(client, n, "test") for n in nodes}
        assert {n: len(v["pulls"]) for n, v in views.items()} == \
            {"hollow-0": 0, "hollow-1": 2, "hollow-2": 0}
        assert all(v["node"] == n and v["backend"] == "containerd" for n, v in views.items())
        # kubelet's limits as the hollow node's config file says.
        assert views["hollow-1"]["slots"]["limit"] == 2
        repos = sorted(p["repositories"][0] for p in views["hollow-1"]["pulls"])
        assert repos == ["registry.scale.test/rollout/app-0", "registry.scale.test/rollout/app-1"]
        # Each agent has a certificate of its own (same CA, same name, other key).
        pems = {(tmp_path / "hollow" / f"{n}.crt").read_bytes() for n in nodes}
        assert len(pems) == len(nodes)
        # A node without a hollow agent is not served by another one.
        with pytest.raises(StatusError) as err:
            await fetch_node_view(client, "hollow-9", "test")
        assert err.value.code == 503
    finally:
        await client.close()
        await client.directory.stop()
        for node in h.nodes.values():
            if node.runner is not None:
                await node.runner.cleanup()
        await h.api.close()
        await kube.stop()
