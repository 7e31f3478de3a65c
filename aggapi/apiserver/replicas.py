"""The collections on every replica, computed on one: a replica that does not lead
forwards each podimagepulls/nodeimagepulls request (already authenticated and
authorized here) to the leader and streams the answer back, so every client sees
one history whichever replica the aggregator picks.

The forwarded request is the leader's to authorize again, as this replica: it carries
this replica's ServiceAccount token (a TokenReview on the leader; the chart lets that
account read the collections) and goes to the address the leader wrote in the Lease,
pinned to the serving certificate it wrote there. Nothing else is trusted: a request
that says it was forwarded and reaches a replica that does not lead (the leader just
changed) is 503, never forwarded again. When the leader changes, every watch
forwarded to the old one ends, after its last whole line (a cut inside an event would
be a decode error to the client, not the end of a watch): the client watches again
from its last version and reaches the new term, which goes on from it (its mirror of
the old term has it, ``mirror.py``) or answers 410 and the client relists; never
silence. A forwarded list is not cut: the old term's answer is whole and consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from aggapi.apiserver.election import Election, Leader
from aggapi.apiserver.requestinfo import INFO
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.status import Handler, StatusError

FORWARDED = "X-Aggapi-Forwarded-By"
CONNECT_TIMEOUT = 5.0
COPIED_HEADERS = ("Content-Type", "Retry-After", "Audit-Id")
Token = Callable[[], Awaitable[str | None]]


def cert_sha256(cert_file: str) -> str:
    """The hex sha256 of the first certificate in a PEM file (the serving one)."""
    pem = Path(cert_file).read_text()
    end = "-----END CERTIFICATE-----"
    first = pem[:pem.index(end) + len(end)]
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(first)).hexdigest()


class Forwarder:
    def __init__(self, election: Election, token: Token, identity: str,
                 lifecycle: Lifecycle) -> None:
        self.election, self.token, self.identity = election, token, identity
        self.lifecycle = lifecycle
        self._session: aiohttp.ClientSession | None = None
        self._stops: dict[str, asyncio.Event] = {}  # per leader: its streams end
        election.listeners.append(self._leader_changed)

    async def _leader_changed(self) -> None:
        now = self.election.leader.identity if self.election.leader and \
            not self.election.is_leader else ""
        for identity, stop in list(self._stops.items()):
            if identity != now:
                stop.set()
                del self._stops[identity]

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        for stop in self._stops.values():
            stop.set()
        if self._session is not None:
            await self._session.close()

    async def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, FORWARDED: self.identity}
        token = await self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @contextlib.asynccontextmanager
    async def open(self, leader: Leader, path: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET of ``path`` on ``leader`` as this replica, over the same pinned and
        authenticated channel as forwarded requests (the mirror's stream, mirror.py)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
        async with self._client().get(
                leader.endpoint + path, headers=await self._headers("application/json"),
                timeout=timeout,
                ssl=aiohttp.Fingerprint(bytes.fromhex(leader.cert_sha256))) as resp:
            yield resp

    async def forward(self, request: web.Request, leader: Leader) -> web.StreamResponse:
        headers = await self._headers(request.headers.get("Accept", "application/json"))
        stop = self._stops.setdefault(leader.identity, asyncio.Event())
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
        try:
            up_cm = self._client().get(
                leader.endpoint + request.raw_path, headers=headers, timeout=timeout,
                ssl=aiohttp.Fingerprint(bytes.fromhex(leader.cert_sha256)))
            up = await up_cm.__aenter__()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise StatusError(503, f"the collections' leader ({leader.identity}) is not "
                                   f"reachable: {exc}", retry_after=1) from None
        try:
            resp = web.StreamResponse(status=up.status, headers={
                k: up.headers[k] for k in COPIED_HEADERS if k in up.headers})
            resp.headers["Cache-Control"] = "no-cache"
            await resp.prepare(request)
            info = request.get(INFO)
            watch = info is not None and info.verb == "watch"
            async with self.lifecycle.track("forwarded") as shutdown:
                stops = (stop, shutdown, self.lifecycle.draining) if watch else (shutdown,)
                await self._copy(up, resp, stops, lines=watch)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
            return resp
        finally:
            await up_cm.__aexit__(None, None, None)

    @staticmethod
    async def _copy(up: aiohttp.ClientResponse, resp: web.StreamResponse,
                    stops: tuple[asyncio.Event, ...], *, lines: bool = False) -> None:
        """The leader's bytes as they come, until it ends, fails, or a stop is set;
        ``lines``: only whole lines (a watch's events), the part of one never."""
        async def pump() -> None:
            part: list[bytes] = []  # of a line not yet whole
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async for chunk in up.content.iter_any():
                    if not lines:
                        await resp.write(chunk)
                        continue
                    end = chunk.rfind(b"\n") + 1
                    if not end:
                        part.append(chunk)
                        continue
                    await resp.write(b"".join((*part, chunk[:end])))
                    part = [chunk[end:]] if end < len(chunk) else []
        task = asyncio.ensure_future(pump())
        waits = [asyncio.ensure_future(s.wait()) for s in stops]
        try:
            await asyncio.wait([task, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, *waits):
                t.cancel()
            await asyncio.gather(task, *waits, return_exceptions=True)


class LeaderRouted:
    """A collection route: served here while this replica leads, else forwarded.
    ``term``: the epoch the feeds serve now; until it is the election's (a new leader
    waits up to mirror.SETTLE s for its mirror's last changes), 503: a request served
    from the feeds of no term would start a build whose versions no term keeps."""

    def __init__(self, local: Handler, election: Election,
                 forwarder: Forwarder | None,
                 term: Callable[[], int | None] | None = None) -> None:
        self.local, self.election, self.forwarder = local, election, forwarder
        self.term = term

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if self.election.is_leader:
            if self.term is not None and self.term() != self.election.epoch:
                raise StatusError(503, "this replica is starting its term of the "
                                       "podimagepulls and nodeimagepulls collections",
                                  retry_after=1)
            return await self.local(request)
        leader = self.election.leader
        if FORWARDED in request.headers or leader is None or self.forwarder is None:
            raise StatusError(503, "no replica leads the podimagepulls and nodeimagepulls "
                                   "collections yet", retry_after=1)
        return await self.forwarder.forward(request, leader)
