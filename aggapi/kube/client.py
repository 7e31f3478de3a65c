"""A small Kubernetes REST client on aiohttp: JSON in, plain dicts out, and watches.

The apiserver needs a handful of calls (TokenReview, SubjectAccessReview, get/list
pods, list+watch a few resources). kubernetes_asyncio would do, but importing it
costs ~40 MiB of model classes, and its typed models silently drop fields newer
than the client; raw JSON keeps every field (the pod we sign for the agent must be
the pod as the API returned it).

    async with await load_client() as kube:
        pod = await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import random
import ssl
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

import aiohttp

from aggapi.kube.kubeconfig import ClusterConfig, KubeConfigError, load, ssl_context

__all__ = ["KubeClient", "KubeConfigError", "KubeError", "client_for_url", "load_client",
           "path_segment"]

Params = Mapping[str, str | int | bool]

USER_AGENT = "aggapi"
# A watch line is one object; kube-apiserver caps objects far below this, so a
# longer line means a broken stream, not an object to buffer.
MAX_WATCH_LINE = 32 << 20
# Past the watch's own timeoutSeconds, how long a silent connection is trusted.
WATCH_READ_SLACK = 30.0
# Bytes from which an answer (a list page) is decoded with the cyclic GC paused.
BIG_BODY = 64 << 10


def loads(raw: bytes) -> Any:
    """``json.loads``, with the cyclic GC paused for a big body. Decoding builds a tree
    (no cycle for the GC to find) of thousands of containers, and every 700 of them
    would start a collection; as an informer's cache grows, full ones scan all of it:
    in bench_scale's cold list of 10,000 pods (21,000 events) 53% of aggapi's CPU was
    the GC inside this decode (py-spy)."""
    if len(raw) < BIG_BODY or not gc.isenabled():
        return json.loads(raw)
    gc.disable()
    try:
        return json.loads(raw)
    finally:
        gc.enable()


class KubeError(Exception):
    """An error answer from the API: HTTP ``status``, ``reason`` (metav1.Status reason,
    else the HTTP reason phrase) and ``message`` (the Status message, else the body)."""

    def __init__(self, status: int, reason: str = "", message: str = "",
                 body: Mapping[str, Any] | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")

    @classmethod
    def from_status(cls, status: int, data: Mapping[str, Any], fallback_reason: str = "",
                    ) -> KubeError:
        return cls(int(data.get("code") or status), str(data.get("reason") or fallback_reason),
                   str(data.get("message") or ""), data)


def path_segment(value: str) -> str:
    """``value`` quoted as one URL path segment. '', '.' and '..' are refused: URL
    normalisation would turn them into a request for a different resource."""
    if value in ("", ".", ".."):
        raise ValueError(f"invalid path segment {value!r}")
    return urllib.parse.quote(value, safe="")


class _TokenFile:
    """A bearer token file, re-read only when it changes (service-account tokens rotate;
    kubelet swaps a symlink, so the inode changes too)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    async def token(self) -> str:
        try:
            st = os.stat(self.path)  # one cheap syscall; the read happens off the loop
        except OSError:
            if self._stamp is None:
                raise
            return self._token  # mid-rotation: the last token is still valid a while
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            text = await asyncio.to_thread(_read_text, self.path)
            self._token, self._stamp = text.strip(), stamp
        return self._token


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


class KubeClient:
    """One connection pool to one API server. Use ``async with`` or call :meth:`close`."""

    def __init__(self, server: str, *, ssl_context: ssl.SSLContext | None = None,
                 token: str | None = None, token_file: str | None = None,
                 tls_server_name: str | None = None, limit: int = 100,
                 request_timeout: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._token = token
        self._token_file = _TokenFile(token_file) if token_file else None
        self._server_name = tls_server_name
        self._limit = limit
        self._timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        # Watches live for minutes, one or two per followed pod: their own pool, not
        # bounded, so they can never use up the connections that SubjectAccessReviews
        # and TokenReviews need.
        self._watch_session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, cfg: ClusterConfig, **kwargs: Any) -> KubeClient:
        return cls(cfg.server, ssl_context=cfg.ssl_context, token=cfg.token,
                   token_file=cfg.token_file, tls_server_name=cfg.tls_server_name, **kwargs)

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit, ssl=self._ssl if self._ssl is not None else True)
        return aiohttp.ClientSession(
            connector=connector, headers={"User-Agent": USER_AGENT,
                                          "Accept": "application/json"})

    def _client(self, watch: bool = False) -> aiohttp.ClientSession:
        # Created on first use, so the client can be built outside a running loop.
        if watch:
            if self._watch_session is None or self._watch_session.closed:
                self._watch_session = self._new_session(0)
            return self._watch_session
        if self._session is None or self._session.closed:
            self._session = self._new_session(self._limit)
        return self._session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def bearer_token(self) -> str | None:
        """The token this client presents (its ServiceAccount's in a pod): the
        apiserver replicas present it to each other (``apiserver/replicas.py``)."""
        return await self._token_file.token() if self._token_file else self._token

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {}
        token = await self.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _url(self, path: str) -> str:
        return self.server + (path if path.startswith("/") else "/" + path)

    @contextlib.asynccontextmanager
    async def _open(self, method: str, path: str, *, params: Params | None = None,
                    data: bytes | None = None, content_type: str | None = None,
                    timeout: aiohttp.ClientTimeout, watch: bool = False,
                    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response of a successful (2xx) call; :class:`KubeError` otherwise."""
        headers = await self._headers(content_type)
        query = {k: _param(v) for k, v in (params or {}).items()}
        extra: dict[str, Any] = {}
        if self._server_name:
            extra["server_hostname"] = self._server_name
        async with self._client(watch).request(method, self._url(path), params=query,
                                               data=data, headers=headers, timeout=timeout,
                                               **extra) as resp:
            if not 200 <= resp.status <= 299:
                raise _error(resp.status, resp.reason or "", await resp.read())
            yield resp

    async def request(self, method: str, path: str, *, params: Params | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: float | None = None) -> dict[str, Any]:
        """One call; the JSON answer, or :class:`KubeError` for a non-2xx status."""
        data = json.dumps(body).encode() if body is not None else None
        async with self._open(method, path, params=params, data=data,
                              content_type=content_type if data is not None else None,
                              timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
                              ) as resp:
            raw = await resp.read()
        if not raw.strip():
            return {}
        try:
            # A page of 500 pods is a megabyte: tens of ms of parsing, off the loop.
            result = loads(raw) if len(raw) < BIG_BODY \
                else await asyncio.to_thread(loads, raw)
        except ValueError:
            result = None
        if not isinstance(result, dict):
            raise KubeError(resp.status, "InvalidResponse",
                            f"{method} {path}: the answer is not a JSON object")
        return result

    async def get(self, path: str, params: Params | None = None, *,
                  timeout: float | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params, timeout=timeout)

    async def post(self, path: str, body: Any, *, params: Params | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
        return await self.request("POST", path, params=params, body=body, timeout=timeout)

    async def patch(self, path: str, body: Any, *,
                    content_type: str = "application/merge-patch+json",
                    timeout: float | None = None) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type=content_type,
                                  timeout=timeout)

    async def delete(self, path: str, params: Params | None = None, *,
                     timeout: float | None = None) -> dict[str, Any]:
        return await self.request("DELETE", path, params=params, timeout=timeout)

    async def watch(self, path: str, params: Params | None = None, *,
                    resource_version: str = "", timeout_seconds: int | None = None,
                    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """``(type, object)`` per watch event until the server ends the stream.

        An ``ERROR`` event is yielded as is (its object is a metav1.Status); a failed
        watch request raises :class:`KubeError`. Close the iterator (e.g.
        ``contextlib.aclosing``) when leaving early, to release the connection."""
        query: dict[str, str | int | bool] = {**(params or {}), "watch": "true",
                                              "allowWatchBookmarks": "true"}
        if resource_version:
            query["resourceVersion"] = resource_version
        read_timeout = None
        if timeout_seconds is not None:
            query["timeoutSeconds"] = timeout_seconds
            read_timeout = timeout_seconds + WATCH_READ_SLACK
        to = aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_read=read_timeout)
        async with self._open("GET", path, params=query, timeout=to, watch=True) as resp:
            async for line in _lines(resp.content):
                event = json.loads(line)
                obj = event.get("object")
                yield str(event.get("type") or ""), obj if isinstance(obj, dict) else {}


def _param(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _error(status: int, phrase: str, raw: bytes) -> KubeError:
    try:
        data = json.loads(raw) if raw.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("kind") == "Status":
        return KubeError.from_status(status, data, phrase)
    text = raw.decode(errors="replace").strip()
    return KubeError(status, phrase, text[:500])


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited lines of any length up to MAX_WATCH_LINE (aiohttp's own
    readline refuses lines longer than its buffer, and big objects exist)."""
    pending: list[bytes] = []
    size = 0
    while chunk := await stream.readany():
        pos = 0
        while (end := chunk.find(b"\n", pos)) >= 0:
            pending.append(chunk[pos:end])
            line = b"".join(pending)
            pending, size, pos = [], 0, end + 1
            if line.strip():
                yield line
        if pos < len(chunk):
            pending.append(chunk[pos:])
            size += len(chunk) - pos
            if size > MAX_WATCH_LINE:
                raise KubeError(500, "InvalidResponse",
                                f"watch event larger than {MAX_WATCH_LINE} bytes")
    line = b"".join(pending)
    if line.strip():
        yield line


async def load_client(kubeconfig: str | None = None, *, context: str | None = None,
                      ) -> KubeClient:
    """A client from ``kubeconfig`` if given, else in-cluster service-account
    credentials when running in a pod, else the default kubeconfig ($KUBECONFIG,
    ~/.kube/config). Raises :class:`KubeConfigError`. The caller closes it."""
    cfg = await asyncio.to_thread(load, kubeconfig, context)
    return KubeClient.from_config(cfg)


def client_for_url(url: str, *, token: str | None = None, ca_file: str | None = None,
                   cert_file: str | None = None, key_file: str | None = None,
                   verify: bool = True) -> KubeClient:
    """A client for an explicit endpoint (tests, fake kube-apiserver, harness)."""
    ctx = None
    if url.startswith("https://"):
        ctx = ssl_context(ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                          verify=verify)
    return KubeClient(url, ssl_context=ctx, token=token)


async def keep_publishing(publish: Callable[[], Awaitable[None]], every: float, what: str,
                          log: logging.Logger) -> None:
    """Publish, then again every ``every`` seconds (an object someone may delete), and
    through API outages with a jittered back-off (0.5 s doubling to 30 s)."""
    backoff = 0.5
    while True:
        try:
            await publish()
            backoff = 0.5
            await asyncio.sleep(every)
            continue
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep trying through API outages
            log.warning("cannot publish %s: %r", what, exc)
        await asyncio.sleep(backoff * (1 + random.random() / 2))
        backoff = min(backoff * 2, 30.0)
