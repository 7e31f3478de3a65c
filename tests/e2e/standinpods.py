"""Pods of the e2e node run by the kubelet stand-in (tests.framework.standin): a running
pod, and one whose big image is being pulled through the throttle proxy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.framework.node import Node
from tests.framework.pods import ContainerSpec
from tests.framework.standin import StandinKubelet, StandinPod, SyncStandin

GROUP_VERSION = "/apis/subresources.aggapi.io/v1alpha1"


@dataclass
class E2EPod:
    namespace: str
    name: str
    container: str
    image: str
    pod: StandinPod

    def path(self, sub: str, query: Mapping[str, str] | None = None, /, *,
             watch: bool = False, **params: str) -> str:
        """The ``sub`` subresource's URL path with the query ``query`` then ``params``
        (a mapping goes positionally, so no key of it can be mistaken for ``watch``)."""
        base = (f"{GROUP_VERSION}{'/watch' if watch else ''}/namespaces/{self.namespace}"
                f"/pods/{self.name}/{sub}")
        qs = "&".join(f"{k}={v}" for k, v in {**(query or {}), **params}.items())
        return f"{base}?{qs}" if qs else base


def run_pod(standin: SyncStandin, name: str, image: str, *,
            command: tuple[str, ...] = ()) -> E2EPod:
    spec = ContainerSpec("app", image, command=command)

    async def go(k: StandinKubelet) -> StandinPod:
        return await k.run(name, [spec])

    pod = standin.call(go)
    assert pod.running is not None, pod.pull_errors
    return E2EPod("default", name, "app", image, pod)


def delete_pod(standin: SyncStandin, pod: StandinPod) -> None:
    async def go(k: StandinKubelet) -> None:
        await k.delete(pod)

    standin.call(go)


def remove_big_image(standin: SyncStandin, node: Node) -> None:
    """Forget the big image under both names, so the next pull downloads every byte."""
    async def go(k: StandinKubelet) -> None:
        for ref in (node.via_throttle(node.images.big), node.via_registry(node.images.big)):
            await k.remove_image(ref)

    standin.call(go)


@dataclass
class PullingPod(E2EPod):
    pull: Any = None  # concurrent.futures.Future of the stand-in's pull + start


def start_pulling_pod(standin: SyncStandin, node: Node, name: str, rate: float, *,
                      start: bool = True) -> PullingPod:
    """A pod whose big image is being pulled through the throttle at ``rate`` bytes/s
    (``start=False``: the Pod object only; call ``begin_pull`` when ready)."""
    remove_big_image(standin, node)
    node.set_rate(rate)
    image = node.via_throttle(node.images.big)
    spec = ContainerSpec("app", image)

    async def create(k: StandinKubelet) -> StandinPod:
        return await k.create(name, [spec])

    p = PullingPod("default", name, "app", image, standin.call(create))
    if start:
        begin_pull(standin, p)
    return p


def begin_pull(standin: SyncStandin, p: PullingPod) -> None:
    """The stand-in pulls (events, CRI) and starts the pod, in the background."""
    async def start(k: StandinKubelet) -> StandinPod:
        return await k.start(p.pod)

    p.pull = standin.spawn(start)


def finish_pulling_pod(standin: SyncStandin, node: Node, p: PullingPod) -> None:
    node.set_rate(None)
    try:
        if p.pull is not None:
            p.pull.result(120)
    finally:
        delete_pod(standin, p.pod)
        remove_big_image(standin, node)

