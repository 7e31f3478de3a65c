"""The local demo (hack/local-up.sh): a node, a pod, a throttled pull watched live.

    python3 -m tests.framework.demo up      node (containerd, registry, throttle proxy,
                                           aggapi agent), pod "demo" bound to it through
                                           the kubelet stand-in, a throttled pull of a
                                           ~150 MB image shown live by `kubectl get --raw`
    python3 -m tests.framework.demo pull    the throttled pull again (pod re-created)
    python3 -m tests.framework.demo down    stop the node (by PID) and clean up containers,
                                           shims, mounts and cgroups

Needs the control plane and aggapi apiserver of instance ``local`` up (hack/local-up.sh
does both first). Everything stays running after ``up`` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time

from aggapi import GROUP, VERSION
from tests.framework import nodestate
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.node import Node, ensure_node
from tests.framework.pods import ContainerSpec
from tests.framework.standin import StandinKubelet, StandinPod, pods_path

POD = "demo"
NAMESPACE = "default"
PULL_SECONDS = 35.0


def log(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


async def _reset(kubelet: StandinKubelet, node: Node) -> None:
    """Delete an earlier demo pod and forget its image, so every byte is pulled again."""
    listed = await kubelet.kube.get(pods_path(NAMESPACE), {"fieldSelector": f"metadata.name={POD}"})
    for obj in listed.get("items") or []:
        old = StandinPod(POD, NAMESPACE, obj["metadata"]["uid"], (), obj)
        # Its containers: every sandbox labelled with the old uid.
        for sb in await kubelet.cri.list_pod_sandboxes({"io.kubernetes.pod.uid": old.uid}):
            for c in await kubelet.cri.list_containers(sb.id):
                await kubelet.cri.stop_container(c.id)
                await kubelet.cri.remove_container(c.id)
            await kubelet.cri.stop_pod_sandbox(sb.id)
            await kubelet.cri.remove_pod_sandbox(sb.id)
        await kubelet.delete(old)
        for c in (obj.get("spec") or {}).get("containers") or ():
            await kubelet.remove_image(c["image"])
    for ref in (node.via_throttle(node.images.big), node.via_registry(node.images.big)):
        await kubelet.remove_image(ref)


def watch_path(namespace: str = NAMESPACE, pod: str = POD) -> str:
    return f"/apis/{GROUP}/{VERSION}/watch/namespaces/{namespace}/pods/{pod}/imagepullprogress"


async def throttled_pull(cp: ControlPlane, node: Node, seconds: float = PULL_SECONDS) -> float:
    """Re-create pod "demo", pull its image at a rate that takes ``seconds``, and show
    ``kubectl get --raw`` of the /watch/ path meanwhile. Returns the pull's duration."""
    total = sum(size for _, size in node.images.big_layers)
    # Each run pulls the big image under a new tag: the agent keeps the last state it saw
    # per image name while nobody watches, and would report the removed image as Done.
    image = node.via_throttle(node.tag(node.images.big, f"demo-{int(time.time())}"))
    async with StandinKubelet.for_node(node) as kubelet:
        await _reset(kubelet, node)
        await asyncio.to_thread(node.set_rate, total / seconds)
        pod = await kubelet.create(POD, [ContainerSpec("app", image)], namespace=NAMESPACE)
        cmd = [binary("kubectl", build=False), f"--kubeconfig={cp.user_kubeconfig('alice')}",
               "get", "--raw", watch_path()]
        print(f"\n$ {shlex.join(['kubectl', *cmd[2:]])}    # as user alice", flush=True)
        watcher = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL)
        await asyncio.sleep(0.5)  # the stream is up before the first byte moves
        t0 = time.monotonic()
        await kubelet.start(pod)
        took = time.monotonic() - t0
        try:
            rc = await asyncio.wait_for(watcher.wait(), 60)
        except TimeoutError:
            watcher.terminate()
            rc = await watcher.wait()
        print(flush=True)
        if rc != 0:
            log(f"kubectl get --raw exited {rc}")
        if pod.pull_errors:
            log(f"pull failed: {pod.pull_errors}")
    await asyncio.to_thread(node.set_rate, None)
    return took


def instructions(cp: ControlPlane, node: Node) -> str:
    gv = f"/apis/{GROUP}/{VERSION}"
    pod = f"{gv}/namespaces/{NAMESPACE}/pods/{POD}"
    users = cp.state / "users"
    wpod = f"{gv}/watch/namespaces/{NAMESPACE}/pods/{POD}"
    return f"""
demo: pod {NAMESPACE}/{POD} runs on node {cp.node_name} (kubelet stand-in, containerd
      {node.cri_address}); its image (~150 MB) was pulled through the throttle proxy.

  export KUBECONFIG={cp.admin_kubeconfig}   # admin
  # users: {users}/{{alice,victor,mallory}}.kubeconfig
  kubectl get apiservice {VERSION}.{GROUP}
  # discovery (kubectl api-resources skips subresources):
  kubectl get --raw {gv} | python3 -m json.tool

  # image pull progress (NDJSON; ends with a Summary line)
  kubectl get --raw {pod}/imagepullprogress
  kubectl get --raw '{pod}/imagepullprogress?granularity=image'
  python3 -m tests.framework.demo pull     # the throttled pull again, live

  # copy a file in and out (uploads need create on pods/copy and on pods/exec)
  kubectl create --raw '{pod}/copy?container=app&path=/tmp/hosts' -f /etc/hosts
  kubectl get --raw '{pod}/copy?container=app&path=/tmp/hosts'
  # long transfers: the /watch/ path (long-running in kube-apiserver, no 60 s cut)
  kubectl create --raw '{wpod}/copy?container=app&path=/tmp/big' -f BIGFILE

  # kubectl plugins (pip install -e . puts them on PATH)
  kubectl image-pull-progress {POD}
  kubectl ncp -c app /etc/hosts {NAMESPACE}/{POD}:/tmp/hosts2
  kubectl ncp -c app {NAMESPACE}/{POD}:/tmp/hosts2 ./hosts2

  # RBAC: alice may do all of this, victor only image pull progress, mallory nothing
  kubectl --kubeconfig {users}/victor.kubeconfig \\
    get --raw '{pod}/copy?container=app&path=/etc/hosts'    # 403
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "pull", "down"])
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    p.add_argument("--pull-seconds", type=float, default=PULL_SECONDS)
    a = p.parse_args(argv)
    cp = ControlPlane(instance=a.instance)
    if a.command == "down":
        if nodestate.has_node(cp.state):
            Node.load(cp).stop()
            log("node stopped: agent, containerd (containers, shims, mounts, cgroups), "
                "throttle proxy, registry")
        return 0
    if not cp.proc("kube-apiserver").alive():
        log("the control plane is not up: run hack/local-up.sh")
        return 1
    t0 = time.monotonic()
    node = ensure_node(cp)
    took = asyncio.run(throttled_pull(cp, node, a.pull_seconds))
    log(f"pull took {took:.1f}s; demo ready in {time.monotonic() - t0:.1f}s")
    print(instructions(cp, node), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
