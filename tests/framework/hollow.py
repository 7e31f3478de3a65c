"""Hollow nodes: the real aggapi agent over a simulated runtime, many in one process.

Each hollow node is what the apiserver sees of a real one: the agent's own app
(``aggapi.agent.app.build_app`` with its auth, capability checks and progress
handlers) on its own port, with its own serving certificate from aggapi's CA, found
through an EndpointSlice of the agent Service whose endpoint names the node
(``nodeName``), as ``aggapi.apiserver.agents`` reads them. Only the progress backend
(``tests.framework.simruntime``) and the pod-sandbox check are simulated.

The process also plays the part of those nodes' kubelets' image puller: it watches
the pods bound to its nodes (one watch), asks each node's simulated runtime for their
images, and reports through the real API what kubelet would: Events Pulling, Pulled,
Failed and BackOff from component ``kubelet`` on the node, with kubelet's message
formats (``aggapi.apiserver.imagepullprogress.pullstate`` parses them). kwok's stage
events cannot stand in for those: they come from ``kwok_controller`` with no host and
a fixed message (kwok v0.8.0 ``StageEvent``), which ``aggapi.kube.events`` rightly
refuses as kubelet's. When an image is in, the pod is annotated ``PULLED_ANNOTATION``,
which kwok's stage (``tests.framework.scale``) waits for to start its container.

    python3 -m tests.framework.hollow --kubeconfig K --certs-dir D --state S \
        --address A --base-port P --nodes node-0,node-1,...

Writes ``S/hollow.ready`` once every agent listens and its EndpointSlice is in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import itertools
import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from aggapi.agent.app import build_app, new_parts
from aggapi.agent.auth import server_context
from aggapi.agent.config import AgentConfig
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.kubeletconfig import KubeletConfigReader
from aggapi.agent.main import listen
from aggapi.auth.capability import CapabilityVerifier
from aggapi.kube.client import KubeClient, KubeError, load_client
from aggapi.kube.informer import Informer
from aggapi.runtime.cri import CRIClient, Sandbox
from aggapi.serve import logs
from aggapi.tls import certs, pki
from aggapi.wire import LABEL_POD_UID
from tests.framework.simruntime import Profile, Report, SimBackend, SimNode

log = logging.getLogger("hollow")

PULLED_ANNOTATION = "scale.aggapi.io/pulled"  # the image's digest, once pulled
AGENT_SERVICE = "aggapi-agent"
SLICE_MANAGER = "aggapi-hollow"
TICK = 0.2  # seconds between simulation steps
# Concurrent writes of Events and annotations. Each node's kubelet writes its own, so
# 500 nodes write side by side; with 8 writers each waiting its turn on etcd, the
# Pulled Events of a 10,000-pod rollout came 200 s after the pulls ended.
POSTERS = 32
DONE_LOG = "done.log"
POSTED_LOG = "posted.log"  # when each pod's Pulled Event was written (accepted)


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration prints it (kubelet's messages use it)."""
    if seconds < 1:
        return f"{seconds * 1000:.3f}".rstrip("0").rstrip(".") + "ms"
    m, s = divmod(seconds, 60)
    text = f"{s:.9f}".rstrip("0").rstrip(".") + "s"
    return f"{int(m)}m{text}" if m else text


def kubelet_events(r: Report) -> list[tuple[str, str, str]]:
    """(type, reason, message) kubelet emits for ``r`` (pkg/kubelet/images)."""
    img = r.image
    if r.kind == "pulling":
        return [("Normal", "Pulling", f'Pulling image "{img}"')]
    if r.kind == "done":
        return [("Normal", "Pulled",
                 f'Successfully pulled image "{img}" in {go_duration(r.seconds - r.waited)} '
                 f"({go_duration(r.seconds)} including waiting). Image size: {r.size} bytes.")]
    return [("Warning", "Failed",
             f'Failed to pull image "{img}": failed to pull and unpack image "{img}": '
             "failed to copy: httpReadSeeker: failed open: unexpected status code 503 "
             "Service Unavailable (simulated)"),
            ("Warning", "Failed", "Error: ErrImagePull"),
            ("Normal", "BackOff", f'Back-off pulling image "{img}"'),
            ("Warning", "Failed", "Error: ImagePullBackOff")]


class Sandboxes:
    """The agent's pod check (``SandboxLister``): the pods kubelet runs on the node."""

    def __init__(self) -> None:
        self.pods: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name)

    async def list_pod_sandboxes(self, labels: Mapping[str, str] | None = None
                                 ) -> list[Sandbox]:
        uid = (labels or {}).get(LABEL_POD_UID, "")
        pod = self.pods.get(uid)
        if pod is None:
            return []
        return [Sandbox(id=uid, name=pod[1], namespace=pod[0], uid=uid,
                        state="SANDBOX_READY", labels={LABEL_POD_UID: uid}, annotations={},
                        runtime_handler="")]


@dataclasses.dataclass
class HollowNode:
    name: str
    port: int
    sim: SimNode
    sandboxes: Sandboxes
    runner: web.AppRunner | None = None


class Hollow:
    def __init__(self, api: KubeClient, args: argparse.Namespace) -> None:
        self.api = api
        self.args = args
        lo, hi = Profile.layer_rate
        profile = Profile(seed=args.seed, fail_fraction=args.fail_fraction,
                          back_off=args.back_off,
                          layer_rate=(max(1, int(lo / args.slowdown)),
                                      max(1, int(hi / args.slowdown))))
        self.nodes = {n: HollowNode(n, args.base_port + i, SimNode(n, profile, args.slots),
                                    Sandboxes())
                      for i, n in enumerate(args.nodes.split(","))}
        self.pods = Informer(api, "/api/v1/pods", {"fieldSelector": "spec.nodeName!="})
        self.pods.add_listener(self._pod)
        self.outbox: asyncio.Queue[tuple[Report, str]] = asyncio.Queue()
        self._seq = itertools.count()
        self.posted = 0

    # --- agents ----------------------------------------------------------------------
    def _serving_cert(self, state: Path, ca: pki.KeyPair, node: str) -> tuple[str, str]:
        crt, key = state / f"{node}.crt", state / f"{node}.key"
        if not crt.exists():
            pki.issue(ca, certs.AGENT_CN, dns=[AGENT_SERVICE], ips=[self.args.address],
                      server=True).write(crt, key)
        return str(crt), str(key)

    async def start_agents(self) -> None:
        d, state = Path(self.args.certs_dir), Path(self.args.state) / "hollow"
        state.mkdir(parents=True, exist_ok=True)
        ca = pki.load_pair(d / "ca.crt", d / "ca.key")
        kubelet_config = state / "kubelet-config.yaml"
        kubelet_config.write_text("serializeImagePulls: false\n"
                                  f"maxParallelImagePulls: {self.args.slots}\n")
        token_key = (d / "token-signing.pub").read_bytes()
        cri = CRIClient(f"unix://{state}/no-cri.sock")  # never dialled: no sandbox, no copy
        for node in self.nodes.values():
            cert, key = await asyncio.to_thread(self._serving_cert, state, ca, node.name)
            config = AgentConfig(
                node_name=node.name, tls_cert=cert, tls_key=key,
                client_ca=str(d / "ca.crt"), token_public_key=str(d / "token-signing.pub"),
                host=self.args.address, port=node.port, kubelet_config=str(kubelet_config),
                copy=CopyLimits(state_dir=str(state / "inflight" / node.name)))
            parts = new_parts(config, cri=cri, containerd=None,
                              verifier=CapabilityVerifier(token_key, node.name),
                              backend=SimBackend(node.sim))
            # The node's "kubelet" is the config file: no /proc scan finding another
            # harness's real kubelet on this host.
            parts.pull_limits = KubeletConfigReader(str(kubelet_config), proc=str(state))
            tls = server_context(cert, key, config.client_ca)
            node.runner = await listen(build_app(parts, pod_check=node.sandboxes), config,
                                       node.port, tls)

    async def publish(self) -> None:
        """One EndpointSlice per hollow agent (each has its own port)."""
        ns = self.args.namespace
        for node in self.nodes.values():
            name = f"{AGENT_SERVICE}-hollow-{node.name}"
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": ns,
                                 "labels": {"kubernetes.io/service-name": AGENT_SERVICE,
                                            "endpointslice.kubernetes.io/managed-by":
                                                SLICE_MANAGER}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [self.args.address], "nodeName": node.name,
                                   "conditions": {"ready": True}}],
                    "ports": [{"name": "https", "port": node.port, "protocol": "TCP"}]}
            await self.api.request(
                "PATCH", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{name}",
                params={"fieldManager": SLICE_MANAGER, "force": "true"}, body=body,
                content_type="application/apply-patch+yaml")

    # --- kubelet's puller ----------------------------------------------------------------
    def _pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "RELIST":
            for pod in self.pods.items.values():
                self._pod("ADDED", pod)
            return
        node = self.nodes.get(str((obj.get("spec") or {}).get("nodeName") or ""))
        meta = obj.get("metadata") or {}
        if node is None or kind == "DELETED" or meta.get("deletionTimestamp"):
            return
        key = (str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
        node.sandboxes.pods[key[2]] = (key[0], key[1])
        if PULLED_ANNOTATION in (meta.get("annotations") or {}):
            return
        now = time.monotonic()
        for c in (obj.get("spec") or {}).get("containers") or ():
            for r in node.sim.request(key, str(c.get("image")), now):
                self.outbox.put_nowait((r, node.name))

    async def simulate(self) -> None:
        # When each pull finished, by CLOCK_MONOTONIC (one clock for every process on
        # the host): the bench's update latency runs from here to the client's Done.
        done_log = Path(self.args.state) / "hollow" / DONE_LOG
        with done_log.open("a") as out:
            while True:
                now = time.monotonic()
                for node in self.nodes.values():
                    for r in node.sim.tick(now):
                        self.outbox.put_nowait((r, node.name))
                        if r.kind == "done":
                            out.write(f"{now:.3f} {r.pod[0]}/{r.pod[1]}\n")
                out.flush()
                await asyncio.sleep(TICK)

    def _event(self, r: Report, node: str, kind: str, reason: str,
               message: str) -> dict[str, Any]:
        ns, name, uid = r.pod
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{next(self._seq):016x}", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
                                   "name": name, "uid": uid,
                                   "fieldPath": "spec.containers{app}"},
                "reason": reason, "message": message, "type": kind,
                "source": {"component": "kubelet", "host": node},
                "reportingComponent": "kubelet", "reportingInstance": node,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}

    async def post(self) -> None:
        posted = (Path(self.args.state) / "hollow" / POSTED_LOG).open("a", buffering=1)
        while True:
            r, node = await self.outbox.get()
            ns, name, _uid = r.pod
            try:
                for kind, reason, message in kubelet_events(r):
                    await self.api.post(f"/api/v1/namespaces/{ns}/events",
                                        self._event(r, node, kind, reason, message))
                if r.kind == "done":
                    # The harness's own lag ends here: the rest is kube-apiserver,
                    # aggapi and kubectl.
                    posted.write(f"{time.monotonic():.3f} {ns}/{name}\n")
                    plan = self.nodes[node].sim.present[r.image]
                    await self.api.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {
                        "metadata": {"annotations": {PULLED_ANNOTATION: plan.digest}}})
                self.posted += 1
            except KubeError as err:
                log.warning("reporting %s of %s/%s: %s", r.kind, ns, name, err)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start_agents()
        await self.publish()
        self.pods.start()
        tasks = [asyncio.create_task(self.simulate())] + [
            asyncio.create_task(self.post()) for _ in range(POSTERS)]
        (Path(self.args.state) / "hollow.ready").write_text(f"{len(self.nodes)}\n")
        log.info("hollow nodes serving: %d", len(self.nodes))
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.pods.stop()
            for node in self.nodes.values():
                if node.runner is not None:
                    await node.runner.cleanup()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.hollow",
                                description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--certs-dir", required=True, help="aggapi's PKI (ca.crt/key, token key)")
    p.add_argument("--state", required=True)
    p.add_argument("--namespace", default="aggapi")
    p.add_argument("--address", required=True, help="where every hollow agent listens")
    p.add_argument("--base-port", type=int, default=20000)
    p.add_argument("--nodes", required=True, help="comma-separated node names")
    p.add_argument("--slots", type=int, default=2, help="kubelet's maxParallelImagePulls")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fail-fraction", type=float, default=0.02)
    p.add_argument("--back-off", type=float, default=2.0)
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="every layer downloads this many times slower (a longer rollout)")
    return p


async def amain(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    api = await load_client(args.kubeconfig)
    try:
        await Hollow(api, args).run(stop)
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure("warning")
    asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
