"""Which replica computes podimagepulls and nodeimagepulls: one leader, elected with a
``coordination.k8s.io/v1`` Lease as client-go's leaderelection does (optimistic
updates on the Lease's resourceVersion, expiry judged by when this replica last saw
the Lease change, not by anyone's clock).

The leader writes beside its hold, in the Lease's annotations, what the others need
to forward to it: its address, the sha256 of its serving certificate (they pin it:
the Lease is writable by the replicas' ServiceAccount only) and its term's epoch, the
high bits of every resourceVersion it hands out (``store.Clock``). A new leader's
epoch is above its predecessor's, so no version of an old term is ever taken for one
of the new: the new history goes on from the old one's versions its mirror holds
(``mirror.py``) and answers the others 410 (clients relist).

A leader shutting down hands its term over (``hand_over``, then ``release``; the marks:
``handover.py``): a follower warms its next term while the leader stamps and serves,
then gets the Lease. A leader killed is replaced when its Lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aggapi import tasks
from aggapi.apiserver.handover import (
    HANDOVER,
    HANDOVER_KEYS,
    HANDOVER_POLL,
    SUCCESSOR,
    SUCCESSOR_READY,
    Succession,
    annotated,
    notes,
)
from aggapi.kube.client import KubeClient, KubeError, path_segment

log = logging.getLogger(__name__)

LEASE_SECONDS = 15  # client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
ENDPOINT = "aggapi.io/endpoint"
CERT_SHA256 = "aggapi.io/serving-cert-sha256"
EPOCH = "aggapi.io/epoch"

OnChange = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Leader:
    identity: str
    endpoint: str  # https://IP:PORT
    cert_sha256: str  # hex digest of its serving certificate (DER)
    epoch: int


class Election:
    """Standalone (no election, one replica): this replica always leads."""

    def __init__(self) -> None:
        self.is_leader = True
        self.leader: Leader | None = None
        self.epoch: int | None = None  # this replica's term while it leads
        self.listeners: list[OnChange] = []

    async def run(self) -> None:
        return

    async def hand_over(self, timeout: float) -> None:
        return

    async def release(self) -> None:
        return

    async def _changed(self) -> None:
        for fn in self.listeners:
            try:
                await fn()
            except Exception:  # one listener's failure must not stop the election
                log.exception("leadership change listener failed")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _leader_of(lease: dict[str, Any]) -> Leader | None:
    spec = lease.get("spec") or {}
    ann = (lease.get("metadata") or {}).get("annotations") or {}
    holder = str(spec.get("holderIdentity") or "")
    try:
        epoch = int(ann.get(EPOCH) or 0)
    except ValueError:
        epoch = 0
    if not holder or not ann.get(ENDPOINT) or not ann.get(CERT_SHA256):
        return None
    return Leader(holder, str(ann[ENDPOINT]), str(ann[CERT_SHA256]), epoch)


class LeaseElection(Election):
    def __init__(self, kube: KubeClient, *, namespace: str, name: str, identity: str,
                 endpoint: str, cert_sha256: Callable[[], str],
                 lease_seconds: int = LEASE_SECONDS, renew_deadline: float = RENEW_DEADLINE,
                 retry_period: float = RETRY_PERIOD,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.is_leader = False
        self.kube, self.identity, self.endpoint = kube, identity, endpoint
        self._cert = cert_sha256
        self.path = (f"/apis/coordination.k8s.io/v1/namespaces/{path_segment(namespace)}"
                     f"/leases/{path_segment(name)}")
        self.namespace, self.name = namespace, name
        self.lease_seconds, self.renew_deadline = lease_seconds, renew_deadline
        self.retry_period = retry_period
        self._wall, self._mono = wall, monotonic
        self._seen: tuple[str, float] = ("", 0.0)  # the Lease's version, when first seen
        self._renewed = 0.0
        self._released = False  # shutting down: never lead again
        self.succession: Succession | None = None
        self._warming: asyncio.Task[None] | None = None  # this replica's, as successor
        self._handing = False  # a hand-over in the last Lease read: read it often
        self._successor = ""  # the successor this leader hands the Lease to
        self._warm = False  # and whether it said it is warm
        self._lease: dict[str, Any] | None = None  # the hand-over's last read
        self._claimed = False  # this follower named itself successor

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except (KubeError, OSError, TimeoutError, ValueError) as exc:
                log.warning("leader election: %s", exc)
                if self.is_leader and self._mono() - self._renewed > self.renew_deadline:
                    await self._set(False, None)  # cannot renew: step down before expiry
            await asyncio.sleep(HANDOVER_POLL if self._handing else self.retry_period)

    async def tick(self) -> None:
        """One round: renew, take over an expired or released Lease, or follow."""
        if self._released:
            return
        try:
            lease: dict[str, Any] | None = await self.kube.get(self.path)
        except KubeError as err:
            if err.status != 404:
                raise
            lease = None
        if lease is None:
            await self._acquire(None)
            return
        now = self._mono()
        version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if version != self._seen[0]:
            self._seen = (version, now)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if holder == self.identity:
            await (self._renew(lease) if self.is_leader else self._acquire(lease))
            return
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if not holder or now - self._seen[1] > duration:
            await self._acquire(lease)
            return
        await self._set(False, _leader_of(lease))
        await self._succeed(lease, holder)

    def _body(self, lease: dict[str, Any] | None, epoch: int,
              drop: tuple[str, ...] = ()) -> dict[str, Any]:
        base = lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": self.name, "namespace": self.namespace}}
        return annotated(base, {ENDPOINT: self.endpoint, CERT_SHA256: self._cert(),
                                EPOCH: str(epoch)}, drop=drop)

    async def _acquire(self, lease: dict[str, Any] | None) -> None:
        old = _leader_of(lease) if lease is not None else None
        try:
            before = int(notes(lease or {}).get(EPOCH) or 0)
        except ValueError:
            before = 0
        # Above the last term's, and above any earlier Lease's (one deleted since):
        # epochs are seconds of wall time unless the last term's is higher.
        epoch = max(int(self._wall()), before + 1, (old.epoch + 1) if old else 0)
        body = self._body(lease, epoch, drop=HANDOVER_KEYS)
        spec = dict(body.get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") != self.identity:
            transitions += 1 if lease is not None else 0
        now = _now()
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds":
                     self.lease_seconds, "acquireTime": now, "renewTime": now,
                     "leaseTransitions": transitions})
        body["spec"] = spec
        try:
            if lease is None:
                stored = await self.kube.post(self.path.rsplit("/", 1)[0], body)
            else:
                stored = await self.kube.request("PUT", self.path, body=body)
        except KubeError as err:
            if err.status in (409, 422):  # another replica was first
                return
            raise
        self._renewed = self._mono()
        self._seen = (str((stored.get("metadata") or {}).get("resourceVersion") or ""),
                      self._renewed)
        log.info("leading podimagepulls/nodeimagepulls from epoch %d", epoch)
        self.epoch, self._handing = epoch, False
        await tasks.cancel(self._warming)  # done, or never to be: the new term decides
        self._warming = None
        await self._set(True, _leader_of(stored))

    async def _renew(self, lease: dict[str, Any]) -> None:
        body = self._body(lease, self.epoch or 0)
        body["spec"] = {**(body.get("spec") or {}), "renewTime": _now()}
        try:
            stored = await self.kube.request("PUT", self.path, body=body)
        except KubeError as err:
            if err.status == 409:  # changed under us: the next round reads it again
                return
            raise
        self._renewed = self._mono()
        self._seen = (str((stored.get("metadata") or {}).get("resourceVersion") or ""),
                      self._renewed)
        self.leader = _leader_of(stored)

    async def _set(self, leading: bool, leader: Leader | None) -> None:
        changed = leading != self.is_leader or (
            (leader.identity, leader.epoch) if leader else None) != (
            (self.leader.identity, self.leader.epoch) if self.leader else None)
        self.is_leader, self.leader = leading, leader
        if not leading:
            self.epoch = None
        if changed:
            await self._changed()

    async def hand_over(self, timeout: float) -> None:
        """On shutdown, before ``release``: ask for a successor and lead on until one
        is warm (or ``timeout`` s), so that its term starts from a current mirror and
        a warm build instead of its informers' first lists. Serving goes on meanwhile."""
        if not self.is_leader or timeout <= 0 or self.succession is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Followers read the Lease every retry period: one able to succeed has named
        # itself after two (none: the only replica, or the others shutting down too).
        claim_by = loop.time() + 3 * self.retry_period
        log.info("handing over podimagepulls/nodeimagepulls", extra={
            "timeoutSeconds": timeout})
        while self.is_leader and loop.time() < deadline:
            try:
                lease = await self.kube.get(self.path)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                ann = notes(lease)
                if ann.get(HANDOVER) != self.identity:
                    await self._annotate(lease, {HANDOVER: self.identity})
                else:
                    named = str(ann.get(SUCCESSOR) or "")
                    if self._successor and not named:  # it withdrew: another may claim
                        claim_by = loop.time() + 3 * self.retry_period
                    self._successor = named
                    self._warm = bool(ann.get(SUCCESSOR_READY))
                    self._lease = lease
                    if self._warm:
                        log.info("successor warm", extra={"successor": self._successor})
                        return
                    if not self._successor and loop.time() > claim_by:
                        log.info("no follower can succeed: releasing the Lease")
                        return
            except (KubeError, OSError, TimeoutError, ValueError) as exc:
                log.warning("hand-over: %s", exc)
            await asyncio.sleep(HANDOVER_POLL)
        log.warning("successor not warm within %.0f s: handing the Lease over as it is",
                    timeout, extra={"successor": self._successor})

    async def release(self) -> None:
        """On shutdown (before draining): give the Lease up, to the successor
        (``hand_over``: warm or not, its informers are ahead of any other follower's)
        or to whichever replica takes it at its next round, not after it expires. The
        address goes with it: until the successor writes its own, the others forward
        nowhere (503, retried)."""
        self._released = True
        await tasks.cancel(self._warming)
        if not self.is_leader:
            await self._withdraw()
            return
        # The hand-over's last read, if any: one request less to kube-apiserver
        # between the successor's "warm" and its term (read again on a 409).
        lease, self._lease = self._lease, None
        with contextlib.suppress(KubeError, OSError, TimeoutError):
            for _ in range(3):
                lease = lease or await self.kube.get(self.path)
                if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                    break
                try:
                    await self.kube.request("PUT", self.path, body=self._handed(lease))
                except KubeError as err:
                    if err.status != 409:
                        raise
                    lease = None
                    continue
                if self._successor:
                    log.info("handed the Lease over", extra={"successor": self._successor})
                break
        await self._set(False, None)

    def _handed(self, lease: dict[str, Any]) -> dict[str, Any]:
        """``lease`` given to the successor (or to no one), without this replica's
        address and the hand-over's marks."""
        spec = lease.get("spec") or {}
        to = self._successor
        duration = self.lease_seconds if to else 1
        return {**annotated(lease, {}, drop=(ENDPOINT, CERT_SHA256, *HANDOVER_KEYS)),
                "spec": {**spec, "holderIdentity": to, "renewTime": _now(),
                         "leaseDurationSeconds": duration,
                         "leaseTransitions": int(spec.get("leaseTransitions") or 0)
                         + (1 if to else 0)}}

    # --- as a follower: succeeding a leader that hands over --------------------------

    async def _withdraw(self) -> None:
        """Shutting down while named successor: un-name itself, so that the leader
        does not hand the Lease to a replica that is going (another may claim)."""
        if self._warming is None and not self._claimed:
            return
        with contextlib.suppress(KubeError, OSError, TimeoutError):
            lease = await self.kube.get(self.path)
            if notes(lease).get(SUCCESSOR) == self.identity:
                await self.kube.request("PUT", self.path, body=annotated(
                    lease, {}, drop=(SUCCESSOR, SUCCESSOR_READY)))

    async def _annotate(self, lease: dict[str, Any], extra: dict[str, str]) -> bool:
        """Write ``extra`` into the Lease's annotations, as read; False when it changed
        meanwhile (409: read again at the next round)."""
        try:
            await self.kube.request("PUT", self.path, body=annotated(lease, extra))
        except KubeError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def _succeed(self, lease: dict[str, Any], holder: str) -> None:
        """A follower's part in a hand-over: name itself successor when none is and it
        can, warm its next term, say when it is warm; drop it when the hand-over is
        gone (the leader released to no one, or another leads)."""
        ann = notes(lease)
        asked = bool(holder) and ann.get(HANDOVER) == holder
        successor = str(ann.get(SUCCESSOR) or "")
        # Read often while a hand-over runs, and while the Lease is handed to a
        # successor that has not yet written its address (the others follow it then).
        self._handing = asked or (bool(holder) and _leader_of(lease) is None)
        succession = self.succession
        if succession is None:
            return
        if not asked or self._released or successor not in ("", self.identity):
            if self._warming is not None:
                await tasks.cancel(self._warming)
                self._warming = None
                await succession.cool()
            return
        if not successor:
            if succession.able() and await self._annotate(lease, {SUCCESSOR: self.identity}):
                log.info("warming to succeed %s", holder)
                self._claimed = True
                self._warming = asyncio.create_task(succession.warm(), name="succession")
            return
        if self._warming is None:
            self._warming = asyncio.create_task(succession.warm(), name="succession")
        if self._warming.done() and not ann.get(SUCCESSOR_READY):
            failed = self._warming.cancelled() or self._warming.exception()
            if failed:
                log.warning("warming to succeed %s failed: %r", holder, failed)
                self._warming = None  # tried again at the next round
                return
            await self._annotate(lease, {SUCCESSOR_READY: "true"})
