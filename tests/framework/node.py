"""The node side of the local harness: containerd + runc, a registry behind a throttle
proxy, the test images, and ``aggapi agent`` in the node's network namespace.

Reusable by anything that runs pods on the harness node: the kubelet stand-in
(tests.framework.standin), the demo (tests.framework.demo), the e2e fixtures, and later a
real kubelet (point it at :attr:`Node.cri_address`). Nothing here creates Kubernetes
objects or pods.

Every process is started in its own session with a pidfile in the control plane's
``pids/`` directory (``pid starttime``), so ``Node.load(cp).stop()`` from another process
(``hack/local-down.sh``) stops exactly what was started, by PID. Layout, all under
``<control plane state>/node/``:

    node.json           what ``load`` needs: hosts, addresses, cgroup parent, images
    registry/           docker-registry storage and config (10.251.N.1:<free port>)
    throttle.json       the throttle proxy's rate (its process applies changes, acks)
    containerd/         containerd root, state, socket, config, certs.d (hosts.toml)
    pods/               container logs of the pods run through CRI
    inflight/           the agent's --copy-state-dir
    kubelet.yaml        the agent's --kubelet-config (image-pull limits)

containerd runs in the host network namespace and the agent reaches its unix socket by
path from the node namespace. The registry and the throttle proxy listen on the host bridge
address 10.251.N.1 (not 127.0.0.1): the containerd of every node of a multi-node cluster
(tests.framework.cluster), each in a network namespace of its own, pulls from them too.
Built layers are cached in ``<repo>/.local/oci-cache`` (the ~150 MB random layers are
built once).
What is on disk, and the teardown from there, is tests.framework.nodestate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.framework import nodestate, oci
from tests.framework.containerd import Containerd
from tests.framework.controlplane import ControlPlane
from tests.framework.nodestate import NodeInfo
from tests.framework.procs import HarnessError, Proc, free_port, spawn, wait_ready
from tests.framework.repo import REPO, python_env
from tests.framework.throttle import ThrottleProxy

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


class Node:
    """One harness node: start()/stop() in-process, or load() what another process started."""

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

    # --- lifecycle -------------------------------------------------------------------
    def start(self, *, agent: bool = True, agent_extra: tuple[str, ...] = ()) -> float:
        """Registry, images, throttle proxy, containerd, then the agent. Returns seconds."""
        t0 = time.monotonic()
        ensure_runtime_deps()
        self.stop()  # leftovers of an interrupted run, by their pidfiles
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_registry()
            self._push_images()
            self._start_throttle()
            self._start_containerd()
            if agent:
                self.start_agent(extra=agent_extra)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def start_agent(self, *, extra: tuple[str, ...] = (), wait: float = 30.0) -> Proc:
        kubelet = self.dir / "kubelet.yaml"
        if not kubelet.exists():
            # The stand-in pulls images in parallel, as kubelet with this config does.
            kubelet.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\n"
                               "kind: KubeletConfiguration\nserializeImagePulls: false\n")
        return self.cp.start_agent(
            cri_socket=self.cri_address, containerd_socket=self.cri_address,
            kubelet_config=str(kubelet), wait=wait,
            extra=[f"--copy-state-dir={self.dir / 'inflight'}", *extra])

    def stop_agent(self) -> None:
        self.cp.proc(nodestate.AGENT_PROC).stop()

    def stop(self) -> None:
        """Stop the agent, containerd (and clean up its containers, shims, mounts and
        cgroups), the throttle proxy and the registry; remove the node directory."""
        nodestate.teardown(self.cp.state, info=self.info, containerd=self.containerd)
        self.containerd = None
        self.info = NodeInfo()

    @classmethod
    def load(cls, cp: ControlPlane) -> Node:
        """The node another process started (from node.json)."""
        node = cls(cp)
        node.info = nodestate.load_info(cp.state)
        return node

    def _save(self) -> None:
        nodestate.save_info(self.cp.state, self.info)

    def running(self) -> dict[str, int | None]:
        return {n: self.proc(n).pid() for n in nodestate.NODE_PROCS} | {
            nodestate.AGENT_PROC: self.cp.proc(nodestate.AGENT_PROC).pid()}

    # --- registry --------------------------------------------------------------------
    def _start_registry(self) -> None:
        proc = self.proc("registry")
        if proc.alive() and self.info.registry_host:
            return
        port = free_port(self.bind)
        d = self.dir / "registry"
        (d / "storage").mkdir(parents=True, exist_ok=True)
        cfg = d / "config.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {d / 'storage'}\n"
            "  delete:\n    enabled: true\n  redirect:\n    disable: true\n"
            f"http:\n  addr: {self.bind}:{port}\n")
        proc = spawn("node-registry", [REGISTRY_BIN, "serve", str(cfg)], self.cp.state)
        self.info.registry_host = f"{self.bind}:{port}"
        self._save()
        _wait(lambda: _http_ok(f"http://{self.info.registry_host}/v2/"), 20,
              "docker-registry", proc)

    def _push_images(self) -> None:
        cache = oci.BlobCache(self.cache_dir)
        host = self.info.registry_host
        pause = oci.pause_image(cache)
        oci.push_image(host, "aggapi-test/pause", pause, "1")
        oci.push_image(host, "aggapi-test/busybox", oci.busybox_image(cache), "1")
        oci.push_image(host, "aggapi-test/noshell", oci.no_shell_image(cache), "1")
        t0 = time.monotonic()
        layers = [cache.busybox_layer()] + [
            cache.random_layer(n, seed=f"big-{i}")
            for i, n in enumerate((self.big_layer // 2, self.big_layer // 3,
                                   self.big_layer // 6))]
        big = oci.build_image(layers, cmd=["/bin/busybox", "sleep", "3600"],
                              labels={"io.aggapi.test": "big"})
        if time.monotonic() - t0 > 5:
            log(f"built the big image's layers in {time.monotonic() - t0:.0f}s "
                f"(cached in {self.cache_dir})")
        oci.push_image(host, "aggapi-test/big", big, "1")
        self.info.images = {
            "pause": f"{host}/aggapi-test/pause:1",
            "busybox": f"{host}/aggapi-test/busybox:1",
            "noshell": f"{host}/aggapi-test/noshell:1",
            "big": "aggapi-test/big:1",
            "big_layers": [(la.blob.digest, la.blob.size) for la in big.layers],
        }
        self.info.sandbox_image = self.info.images["pause"]
        self._save()

    def tag(self, repo_tag: str, new_tag: str) -> str:
        """Give an image in the registry another tag (its manifest again; no blobs move).

        A fresh name for the same bytes: ``tag(images.big, "demo-2")`` is pulled like
        a new image once the old one is removed. Returns ``repository:new_tag``."""
        repo, _, tag = repo_tag.partition(":")
        base = f"http://{self.info.registry_host}/v2/{repo}/manifests"
        req = urllib.request.Request(f"{base}/{tag}", headers={"Accept": oci.MEDIA_MANIFEST})
        with urllib.request.urlopen(req, timeout=10) as r:
            body, media = r.read(), r.headers.get("Content-Type", oci.MEDIA_MANIFEST)
        put = urllib.request.Request(f"{base}/{new_tag}", data=body, method="PUT",
                                     headers={"Content-Type": media})
        with urllib.request.urlopen(put, timeout=10) as r:
            if r.status != 201:
                raise HarnessError(f"tag {repo}:{new_tag}: HTTP {r.status}")
        return f"{repo}:{new_tag}"

    # --- throttle --------------------------------------------------------------------
    @property
    def _throttle_ctl(self) -> Path:
        return self.dir / "throttle.json"

    def _start_throttle(self) -> None:
        proc = self.proc("throttle")
        if proc.alive() and self.info.throttle_host:
            return
        port = free_port(self.bind)
        self._throttle_ctl.write_text(json.dumps({"rate": None, "seq": 0}))
        proc = spawn("node-throttle", [
            sys.executable, "-m", "tests.framework.node", "throttle",
            f"--upstream={self.info.registry_host}", f"--port={port}", f"--bind={self.bind}",
            f"--control={self._throttle_ctl}"], self.cp.state, env=python_env())
        self.info.throttle_host = f"{self.bind}:{port}"
        self._save()
        _wait(lambda: _http_ok(f"http://{self.info.throttle_host}/v2/"), 20,
              "throttle proxy", proc)

    @contextlib.contextmanager
    def own_throttle(self, rate: float | None = None, *,
                     bind: str = "127.0.0.1") -> Iterator[ThrottleProxy]:
        """A throttle of the caller's own in front of the node's registry (the node's
        proxy paces every blob together; this one's record and rate are the caller's),
        trusted by the node's containerd (:func:`throttle_for`)."""
        with throttle_for(self.info.registry_host, [Path(self.info.containerd_dir)], rate,
                          bind=bind) as proxy:
            yield proxy

    def set_rate(self, rate: float | None, timeout: float = 10.0) -> None:
        """Limit pulls through :meth:`via_throttle` to ``rate`` bytes/s (None: unlimited).

        Returns once the proxy process has applied it."""
        try:
            seq = int(json.loads(self._throttle_ctl.read_text()).get("seq", 0)) + 1
        except (OSError, ValueError):
            seq = 1
        tmp = self._throttle_ctl.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rate": rate, "seq": seq}))
        tmp.replace(self._throttle_ctl)
        ack = self._throttle_ctl.with_suffix(".ack")
        _wait(lambda: ack.exists() and ack.read_text().strip() == str(seq), timeout,
              "throttle rate change", self.proc("throttle"))

    # --- containerd ------------------------------------------------------------------
    def _start_containerd(self) -> None:
        if self.proc("containerd").alive() and self.info.containerd_dir:
            return
        (self.dir / "containerd").mkdir(parents=True, exist_ok=True)
        ctd = Containerd(self.dir / "containerd", sandbox_image=self.info.sandbox_image)
        # A name tied to the instance, so a crashed run's cgroups are recognisable.
        ctd.cgroup_parent = f"/aggapi-{self.cp.instance}-{os.urandom(3).hex()}"
        for host in (self.info.registry_host, self.info.throttle_host):
            ctd.add_registry(host)
        self.containerd = ctd
        self.info.containerd_dir = str(ctd.workdir)
        self.info.cgroup_parent = ctd.cgroup_parent
        self.info.snapshotter = ctd.snapshotter
        self._save()
        try:
            ctd.start()
        finally:
            if ctd.proc is not None:
                self.proc("containerd").record(ctd.proc.pid)


@contextlib.contextmanager
def throttle_for(upstream: str, containerd_dirs: Sequence[Path], rate: float | None = None,
                 *, bind: str = "127.0.0.1") -> Iterator[ThrottleProxy]:
    """A ThrottleProxy of the caller's own in front of the registry ``upstream``,
    registered in the certs.d of every containerd whose directory is in
    ``containerd_dirs`` (a cluster's nodes share one link through it) the way
    tests.framework.containerd registers hosts (hosts.toml is read at each pull), removed
    again at the end."""
    proxy = ThrottleProxy(upstream, rate, bind=bind)
    proxy.start()
    dirs = [d / "certs.d" / proxy.host for d in containerd_dirs]
    try:
        for hosts in dirs:
            hosts.mkdir(parents=True, exist_ok=True)
            (hosts / "hosts.toml").write_text(
                f'server = "http://{proxy.host}"\n\n'
                f'[host."http://{proxy.host}"]\n  capabilities = ["pull", "resolve"]\n')
        yield proxy
    finally:
        proxy.stop()
        for hosts in dirs:
            shutil.rmtree(hosts, ignore_errors=True)


def ensure_node(cp: ControlPlane) -> Node:
    """The node of ``cp``, running with its agent: the one started earlier (by any
    process) if its processes are alive, else a fresh one."""
    if nodestate.has_node(cp.state):
        node = Node.load(cp)
        if all(node.proc(n).alive() for n in nodestate.NODE_PROCS):
            node.start_agent()
            return node
        log("node state found but processes are gone: restarting the node")
        node.stop()
    node = Node(cp)
    took = node.start()
    log(f"node up in {took:.1f}s: containerd {node.cri_address}, registry "
        f"{node.info.registry_host}, throttle proxy {node.info.throttle_host}, agent "
        f"{cp.node_host.address} (netns {cp.node_host.netns})")
    return node


# --- helpers -------------------------------------------------------------------------

def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait(ok: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
    wait_ready(ok, timeout, what, proc, poll=0.05)


# --- the throttle proxy as a process ------------------------------------------------

def _serve_throttle(upstream: str, port: int, control: Path, bind: str) -> None:
    """ThrottleProxy (its own loop thread) in this process; applies the rate changes
    written to ``control`` and acknowledges each in ``<control>.ack``."""
    proxy = ThrottleProxy(upstream, port=port, bind=bind)
    proxy.start()
    ack = control.with_suffix(".ack")
    seen = -1
    while True:
        with contextlib.suppress(OSError, ValueError):
            ctl = json.loads(control.read_text())
            seq = int(ctl.get("seq", 0))
            if seq != seen:
                rate = ctl.get("rate")
                proxy.set_rate(float(rate) if rate else None)
                tmp = ack.with_suffix(".ack.tmp")
                tmp.write_text(f"{seq}\n")
                tmp.replace(ack)
                print(f"throttle: rate {rate} (seq {seq})", flush=True)
                seen = seq
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throttle", help="run the throttle proxy (started by Node.start)")
    t.add_argument("--upstream", required=True)
    t.add_argument("--port", type=int, required=True)
    t.add_argument("--control", type=Path, required=True)
    t.add_argument("--bind", default="127.0.0.1")
    for name in ("up", "down", "status"):
        s = sub.add_parser(name, help=f"{name} the node of a running control plane")
        s.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    a = p.parse_args(argv)
    if a.command == "throttle":
        _serve_throttle(a.upstream, a.port, a.control, a.bind)
        return 0
    cp = ControlPlane(instance=a.instance)
    if a.command == "up":
        node = Node(cp)
        took = node.start()
        log(f"node up in {took:.1f}s: containerd {node.cri_address}, "
            f"registry {node.info.registry_host}, throttle {node.info.throttle_host}")
    elif a.command == "down":
        if nodestate.has_node(cp.state):
            Node.load(cp).stop()
    else:
        print(json.dumps(Node.load(cp).running(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
