"""e2e with a real kubelet (tests.framework.kubelet) on the harness node.

Reuses ``control_plane``, ``node`` and ``node_agent`` from tests/e2e/conftest.py. The
kubelet is module-scoped: the CRI stand-in's pods (other modules) carry kubelet's labels,
and a running kubelet would take them over, so it runs only while these modules do.
Fixture order matters: ``kubelet`` first (it may restart kube-apiserver with the
--kubelet-* flags), then the agent, which reads the kubelet's config file.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.framework import oci
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.kubelet import Kubelet, pod_manifest
from tests.framework.kubelet import forget_images as forget_images_async
from tests.framework.node import OCI_CACHE, Node
from tests.framework.procs import Proc, follow_json_lines

GV = "/apis/subresources.aggapi.io/v1alpha1"
MiB = 1 << 20


@dataclass(frozen=True)
class KImages:
    """Repositories (no host) pushed for these tests; see :func:`kimages`."""

    big: str = "aggapi-test/big:1"          # ~150 MB, from tests.framework.node
    kep_a: str = "aggapi-test/kep-a:1"      # 40 MiB each, distinct layers
    kep_b: str = "aggapi-test/kep-b:1"
    init: str = "aggapi-test/init:1"        # three small distinct images
    app_a: str = "aggapi-test/app-a:1"
    app_b: str = "aggapi-test/app-b:1"
    tar: str = "aggapi-test/busybox-tar:1"  # busybox with tar and sha256sum on PATH
    missing: str = "aggapi-test/does-not-exist:1"


@pytest.fixture(scope="session")
def kimages(node: Node) -> KImages:
    cache = oci.BlobCache(OCI_CACHE)
    host = node.info.registry_host
    base = cache.busybox_layer()
    im = KImages()

    def push(ref: str, layers: list[oci.Layer], **kw: Any) -> None:
        repo, tag = ref.split(":")
        oci.push_image(host, repo, oci.build_image(
            layers, cmd=["/bin/busybox", "sleep", "3600"], labels={"io.aggapi.test": repo},
            **kw), tag)

    # No layer in common: a shared base layer would be pulled once, by whichever
    # pull comes first, and blur which pull's bytes are which.
    for ref in (im.kep_a, im.kep_b):
        own_base = cache.files_layer([
            oci.TarEntry("bin", kind="dir", mode=0o755),
            oci.TarEntry("bin/busybox", src=oci.BUSYBOX, mode=0o755),
            oci.TarEntry("image-id", data=ref.encode())])
        push(ref, [own_base, cache.random_layer(40 * MiB, seed=ref)])
    push(im.init, [base, cache.random_layer(3 * MiB, seed="init")])
    push(im.app_a, [base, cache.random_layer(4 * MiB, seed="app-a")])
    push(im.app_b, [base, cache.random_layer(5 * MiB, seed="app-b")])
    links = [oci.TarEntry(f"bin/{a}", kind="symlink", target="busybox")
             for a in ("tar", "sha256sum", "ls", "cat", "rm", "mkdir")]
    push(im.tar, [base, cache.files_layer(links)])
    return im


@pytest.fixture(scope="module")
def real_node(kubelet: Kubelet, node_agent: Proc, node: Node) -> Iterator[Kubelet]:
    """kubelet + aggapi apiserver + agent: the full path. Pods are deleted after each
    module; the throttle is reset."""
    yield kubelet
    node.set_rate(None)


# --- helpers ------------------------------------------------------------------------------

def create_pods(cp: ControlPlane, pods: Sequence[dict[str, Any]]) -> None:
    """All pods in one request: kubelet sees them at (nearly) the same time."""
    cp.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": list(pods)}))


def pod(node: Node, name: str, containers: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return pod_manifest(name, containers, node=node.name, **kw)


def get_pod(cp: ControlPlane, name: str, ns: str = "default") -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "pod", name, "-n", ns, "-o",
                                                "json").stdout)
    return out


def events(cp: ControlPlane, name: str, ns: str = "default") -> list[dict[str, Any]]:
    out = json.loads(cp.kubectl("get", "events", "-n", ns, "-o", "json",
                                f"--field-selector=involvedObject.name={name}").stdout)
    items: list[dict[str, Any]] = out.get("items") or []
    return items


def wait_for(ok: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = ok()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_running(cp: ControlPlane, name: str, timeout: float = 120.0) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        p = get_pod(cp, name)
        return p if (p.get("status") or {}).get("phase") == "Running" else None

    out: dict[str, Any] = wait_for(ok, timeout, f"pod {name} Running")
    return out


def delete_pods(cp: ControlPlane, *names: str) -> None:
    cp.kubectl("delete", "pod", *names, "--grace-period=0", "--force", "--wait=true",
               "--ignore-not-found", check=False)


def forget_images(node: Node, *repos: str) -> None:
    asyncio.run(forget_images_async(node.cri_address, *repos))


@dataclass
class ProgressStream:
    """``kubectl get --raw`` on the /watch/ path of pods/P/imagepullprogress, read in a
    thread: (wall-clock receive time, object) per line."""

    cp: ControlPlane
    name: str
    granularity: str = "layer"
    namespace: str = "default"
    user: str | None = None  # an e2e user of the harness (None: admin)
    objects: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    thread: threading.Thread | None = None
    stderr: str = ""

    @property
    def path(self) -> str:
        return (f"{GV}/watch/namespaces/{self.namespace}/pods/{self.name}/imagepullprogress"
                f"?granularity={self.granularity}")

    def start(self) -> ProgressStream:
        kubeconfig = (self.cp.admin_kubeconfig if self.user is None
                      else self.cp.user_kubeconfig(self.user))
        self.proc = subprocess.Popen(
            [binary("kubectl"), f"--kubeconfig={kubeconfig}", "get", "--raw",
             self.path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.thread = follow_json_lines(self.proc, self.objects, clock=time.time)
        return self

    def wait(self, timeout: float) -> int:
        assert self.proc is not None and self.thread is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"stream of {self.name} still open after {timeout}s; "
                                 f"last: {self.objects[-3:]}") from None
        self.thread.join(5)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return rc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, o) for t, o in self.objects if o.get("kind") == kind]

    def first(self, pred: Any) -> tuple[float, dict[str, Any]] | None:
        return next(((t, o) for t, o in self.objects if pred(o)), None)


def event_time(ev: dict[str, Any]) -> float:
    ts = str(ev.get("lastTimestamp") or ev.get("firstTimestamp")
             or (ev.get("metadata") or {}).get("creationTimestamp"))
    return time.mktime(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def obj_time(o: dict[str, Any]) -> float:
    ts = str(o["time"])
    frac = 0.0
    if "." in ts:
        ts, rest = ts.split(".", 1)
        frac = float("0." + rest.rstrip("Z"))
        ts += "Z"
    return time.mktime(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone + frac


def follow_pull(cp: ControlPlane, pods: Sequence[dict[str, Any]], name: str, *,
                reset: Callable[[], None], timeout: float,
                granularity: str = "layer") -> list[dict[str, Any]]:
    """Create ``pods`` and follow ``name``'s progress stream to its end; ``reset()`` undoes
    the test's throttle whatever happens. The objects, the last one a Summary."""
    stream = None
    try:
        create_pods(cp, pods)
        stream = ProgressStream(cp, name, granularity=granularity).start()
        assert stream.wait(timeout) == 0, stream.stderr
    finally:
        reset()
        if stream is not None:
            stream.stop()
    objs = [o for _, o in stream.objects]
    assert objs and objs[-1]["kind"] == "Summary", objs[-3:]
    return objs


def layer_rises(objs: Sequence[dict[str, Any]], digest: str, size: int) -> list[int]:
    """The layer's reported bytes: seen, never backwards, ending at its size."""
    seen = [int(o["progress"]) for o in objs
            if o.get("kind") == "Progress" and o.get("layer") == digest]
    assert seen, f"no progress for layer {digest}"
    assert seen == sorted(seen), f"progress went backwards for {digest}: {seen[:20]}"
    assert max(seen) == size, (digest, max(seen), size)
    return seen
