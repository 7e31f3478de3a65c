"""A simulated container runtime for hollow nodes: deterministic synthetic image pulls.

The agent's progress engine reads a runtime through one seam, its ``Backend``
(``aggapi.agent.progress.poller``): ``observe`` returns what containerd would show
(in-flight pulls with their bytes and rates, and the watched images). Here that state
is computed from a plan instead of read from containerd, so a hollow node costs a few
hundred bytes and no runtime, and the real agent code above it runs unchanged.

Each image's plan is a pure function of (seed, image): its layers' sizes and rates,
and whether its first attempt fails (and at which fraction of its bytes). A node
pulls at most ``slots`` images at once (kubelet's maxParallelImagePulls); layers of
one pull download side by side, each at its own rate. :meth:`SimNode.tick` moves the
clock on and says what kubelet would report (pull started, done, failed, retried);
the hollow kubelet (``tests.framework.hollow``) turns that into Events.

Test and benchmark code only: it never ships (tests/ is outside the wheel and image).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from aggapi import imageref
from aggapi.agent.progress.model import (
    DONE,
    DOWNLOADING,
    WAITING,
    ImageState,
    LayerState,
    NodeState,
    PullState,
)

MiB = 1 << 20


@dataclass(frozen=True)
class Profile:
    """The knobs of a synthetic rollout (byte ranges are per layer)."""

    seed: int = 1
    layers: int = 3
    layer_bytes: tuple[int, int] = (1 * MiB, 6 * MiB)
    layer_rate: tuple[int, int] = (MiB // 2, 2 * MiB)  # bytes per second
    fail_fraction: float = 0.02  # of images whose first attempt fails
    back_off: float = 2.0  # seconds between a failure and the retry (kubelet: 10 s)


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    rate: int


@dataclass(frozen=True)
class Plan:
    image: str
    repository: str  # "host/path", as containerd's distribution-source labels name it
    digest: str
    layers: tuple[Layer, ...]
    fail_at: float | None  # fraction of the bytes where attempt 1 fails; None: never

    @property
    def total(self) -> int:
        return sum(la.size for la in self.layers)


def _draw(seed: int, image: str, what: str) -> float:
    """A number in [0, 1) fixed by (seed, image, what)."""
    h = hashlib.sha256(f"{seed}\0{image}\0{what}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _between(lo: int, hi: int, u: float) -> int:
    return lo + int((hi - lo) * u)


def plan(image: str, profile: Profile) -> Plan:
    ref = imageref.parse(image)
    layers = tuple(
        Layer(digest="sha256:" + hashlib.sha256(f"{profile.seed}:{image}:{i}".encode()).hexdigest(),
              size=_between(*profile.layer_bytes, _draw(profile.seed, image, f"size{i}")),
              rate=max(1, _between(*profile.layer_rate, _draw(profile.seed, image, f"rate{i}"))))
        for i in range(profile.layers))
    fails = _draw(profile.seed, image, "fail") < profile.fail_fraction
    return Plan(image=str(ref), repository=f"{ref.host}/{ref.path}",
                digest="sha256:" + hashlib.sha256(f"{profile.seed}:{image}".encode()).hexdigest(),
                layers=layers,
                fail_at=0.2 + 0.6 * _draw(profile.seed, image, "where") if fails else None)


@dataclass
class Pull:
    plan: Plan
    attempt: int
    lease: str
    started: float  # monotonic
    started_at: float  # epoch, as the runtime reports it
    waited: float  # seconds in the queue before a slot

    def caps(self) -> list[int]:
        """Where each layer stops: its size, or on a failing attempt its share of the
        bytes where the failure hits."""
        at = self.plan.fail_at if self.failing else None
        return [la.size if at is None else int(la.size * at) for la in self.plan.layers]

    def layer_bytes(self, now: float) -> list[int]:
        t = max(0.0, now - self.started)
        return [min(cap, int(la.rate * t)) for la, cap in zip(self.plan.layers, self.caps(),
                                                               strict=True)]

    @property
    def failing(self) -> bool:
        return self.attempt == 1 and self.plan.fail_at is not None

    def outcome(self, now: float) -> str:
        """"" while pulling, else "done" or "failed"."""
        if self.layer_bytes(now) != self.caps():
            return ""
        return "failed" if self.failing else "done"


@dataclass(frozen=True)
class Report:
    """What kubelet says about one pod's image: ``kind`` is pulling | done | failed."""

    kind: str
    pod: tuple[str, str, str]  # namespace, name, uid
    image: str
    attempt: int
    seconds: float = 0.0  # the pull's own duration (done)
    waited: float = 0.0  # of which in kubelet's queue
    size: int = 0


@dataclass
class _Want:
    pod: tuple[str, str, str]
    image: str
    attempt: int
    since: float  # monotonic: when kubelet asked (Pulling)
    not_before: float = 0.0  # back-off


@dataclass
class SimNode:
    """One node's runtime and kubelet puller: a queue, ``slots`` pulls at once."""

    name: str
    profile: Profile
    slots: int
    queue: deque[_Want] = field(default_factory=deque)
    pulling: dict[str, tuple[Pull, _Want]] = field(default_factory=dict)  # by image
    present: dict[str, Plan] = field(default_factory=dict)
    leases: int = 0

    def request(self, pod: tuple[str, str, str], image: str, now: float) -> list[Report]:
        """kubelet wants ``image`` for ``pod`` (per-pod images: no sharing between pods)."""
        ref = str(imageref.parse(image))
        if ref in self.present or ref in self.pulling or any(w.image == ref for w in self.queue):
            return []
        self.queue.append(_Want(pod, ref, 1, now))
        return [Report("pulling", pod, ref, 1)]

    def tick(self, now: float) -> list[Report]:
        out: list[Report] = []
        for image, (pull, want) in list(self.pulling.items()):
            result = pull.outcome(now)
            if result == "done":
                del self.pulling[image]
                self.present[image] = pull.plan
                out.append(Report("done", want.pod, image, pull.attempt,
                                  seconds=now - want.since, waited=pull.waited,
                                  size=pull.plan.total))
            elif result == "failed":
                del self.pulling[image]
                out.append(Report("failed", want.pod, image, pull.attempt))
                self.queue.append(_Want(want.pod, image, want.attempt + 1, now,
                                        not_before=now + self.profile.back_off))
        while len(self.pulling) < self.slots:
            ready = next((w for w in self.queue if w.not_before <= now), None)
            if ready is None:
                break
            want = ready
            self.queue.remove(want)
            if want.attempt > 1:  # kubelet's retry after the back-off: a new Pulling
                want.since = now
                out.append(Report("pulling", want.pod, want.image, want.attempt))
            self.leases += 1
            self.pulling[want.image] = (Pull(plan(want.image, self.profile), want.attempt,
                                             f"sim-{self.name}-{self.leases}", now,
                                             time.time(), now - want.since), want)
        return out

    def observe(self, watched: Iterable[str], now: float) -> NodeState:
        """What containerd would show: every in-flight pull (a lease each), and the
        watched images' layers."""
        pulls = []
        images: dict[str, ImageState] = {}
        want = {str(imageref.parse(w)) for w in watched}
        for image, (pull, _w) in self.pulling.items():
            got = pull.layer_bytes(now)
            running = [la for la, g in zip(pull.plan.layers, got, strict=True) if g < la.size]
            rate = float(sum(la.rate for la in running))
            pulls.append(PullState(
                lease=pull.lease, started_at=pull.started_at, phase=DOWNLOADING,
                repositories=(pull.plan.repository,),
                images=(image,) if image in want else (), root_digest=pull.plan.digest,
                progress=sum(got), total=pull.plan.total, bytes_per_second=rate,
                downloading_layers=len(running)))
            if image in want:
                layers = tuple(LayerState(la.digest, DOWNLOADING if g < la.size else DONE, g,
                                          la.size, float(la.rate) if g < la.size else None)
                               for la, g in zip(pull.plan.layers, got, strict=True))
                images[image] = ImageState(image, DOWNLOADING, layers, sum(got),
                                           pull.plan.total, rate, lease=pull.lease,
                                           root_digest=pull.plan.digest)
        for image in want - images.keys():
            done = self.present.get(image)
            images[image] = ImageState(image, DONE, (), done.total, done.total) if done \
                else ImageState(image, WAITING)
        link = float(sum(p.bytes_per_second or 0 for p in pulls))
        return NodeState("containerd", images, tuple(pulls), time=time.time(),
                         link_bytes_per_second=link)


class SimBackend:
    """The agent's progress backend over one :class:`SimNode`."""

    name = "containerd"

    def __init__(self, node: SimNode) -> None:
        self.node = node

    async def observe(self, watched: Iterable[str]) -> NodeState:
        return self.node.observe(watched, time.monotonic())

    async def present_images(self) -> tuple[str, ...] | None:
        return tuple(sorted(self.node.present))

    def forget(self) -> None:
        """Nothing is kept between observations beyond the simulation itself."""
