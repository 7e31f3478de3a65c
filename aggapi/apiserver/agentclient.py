"""Calls from the apiserver to a node's agent: mTLS plus a signed capability token.

The token carries everything the agent may act on (user, pod, containers, path,
operation), so the agent needs no Kubernetes credentials and cannot be talked into
acting on anything else. Agent-side Status errors are passed through unchanged.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from aggapi.apiserver.agents import AgentDirectory
from aggapi.auth.agentidentity import IdentityPins
from aggapi.auth.capability import CapabilitySigner, ContainerRef
from aggapi.auth.tokenkeys import KeyPublisher
from aggapi.auth.tokenreuse import Reused, ReusedTokens
from aggapi.serve.chunktakeover import takeover_connector
from aggapi.serve.site import READ_BUFSIZE
from aggapi.status import StatusError
from aggapi.wire import RELAYED_ERROR_HEADERS

AGENT_SERVER_NAME = "aggapi-agent"


class _ClientTLS:
    """An SSLContext for agent calls, rebuilt when the cert files change on disk."""

    def __init__(self, ca_file: str, cert_file: str, key_file: str,
                 check_every: float = 30.0) -> None:
        self._files = (ca_file, cert_file, key_file)
        self._check_every = check_every
        self._checked = 0.0
        self._stamp: tuple[float, ...] = ()
        self._ctx: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if self._ctx is None or now - self._checked > self._check_every:
            self._checked = now
            stamp = tuple(os.stat(f).st_mtime for f in self._files)
            if stamp != self._stamp or self._ctx is None:
                ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self._files[0])
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.load_cert_chain(self._files[1], self._files[2])
                self._ctx, self._stamp = ctx, stamp
        assert self._ctx is not None
        return self._ctx


class AgentClient:
    def __init__(
        self,
        directory: AgentDirectory,
        signer: CapabilitySigner,
        *,
        ca_file: str,
        cert_file: str,
        key_file: str,
        server_name: str = AGENT_SERVER_NAME,
        connect_timeout: float = 5.0,
        key_publisher: KeyPublisher | None = None,
        pins: IdentityPins | None = None,
    ) -> None:
        self.directory = directory
        self._signer = signer
        # Publishes the in-memory signer's public key (None: a key file, published by
        # whoever made it).
        self.key_publisher = key_publisher
        # Per-pod agent certificates (agentidentity); None: agents' CA (ca_file).
        self.pins = pins
        self._tls = _ClientTLS(ca_file, cert_file, key_file)
        self._server_name = server_name
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self.reused = ReusedTokens(signer)
        # Agents that took a reusable token once and refused it the second time (their
        # version predates reuse): node -> the agent pod's uid. Single-use tokens for
        # them until another agent pod serves the node.
        self._no_reuse: dict[str, str] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No total timeout: progress streams and copies are long-lived by design.
            self._session = aiohttp.ClientSession(
                # A directory download's chunked tar is decrypted into our own buffers.
                connector=takeover_connector(limit=0, enable_cleanup_closed=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                auto_decompress=False,
                read_bufsize=READ_BUFSIZE,  # see aggapi.serve.site: fewer, larger pieces
            )
        return self._session

    @property
    def key_published(self) -> bool:
        """Whether agents can know this replica's token key (for /readyz)."""
        return self.key_publisher is None or self.key_publisher.published.is_set()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def open(
        self,
        method: str,
        path: str,
        *,
        node: str,
        subject: str,
        operation: str,
        pod_namespace: str = "",
        pod_name: str = "",
        pod_uid: str = "",
        containers: Sequence[ContainerRef] = (),
        copy_path: str | None = None,
        params: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
        reuse: bool = False,
    ) -> aiohttp.ClientResponse:
        """Start a request to ``node``'s agent; the caller reads and releases the response.
        ``reuse``: with a reusable token (``aggapi.auth.tokenreuse``; a node view read,
        nothing named but the node), signed once for many calls.

        Raises StatusError for a missing/unreachable agent (503) and for any error
        Status the agent answered.
        """
        ep = await self.directory.endpoint(node)
        ctx = self._tls.context()
        if self.pins is not None:
            pinned = self.pins.context(ep.pod_uid, node)
            if pinned is None:
                raise StatusError(503, f'the aggapi agent on node "{node}" has not published '
                                       "its identity yet", retry_after=5)
            ctx = pinned
        reused: Reused | None = None
        if reuse and self._no_reuse.get(node) != ep.pod_uid:
            reused = self.reused.get(node=node, subject=subject, operation=operation)
            token = reused.token
        else:
            token = self._signer.sign(
                node=node, subject=subject, operation=operation, pod_namespace=pod_namespace,
                pod_name=pod_name, pod_uid=pod_uid, containers=tuple(containers),
                path=copy_path, params=dict(params or {}),
            )
        hdrs = {"Authorization": f"Bearer {token}", **(headers or {})}
        try:
            resp = await self._get_session().request(
                method, ep.url + path, params=dict(query or {}), headers=hdrs, data=data,
                ssl=ctx, server_hostname=self._server_name,
            )
        except (aiohttp.ClientConnectionError, TimeoutError, ssl.SSLError) as exc:
            raise StatusError(503, f'aggapi agent on node "{node}" is unreachable: {exc}',
                              retry_after=5) from None
        if reused is not None:
            if resp.status == 401:
                self.reused.forget(node, subject, operation)
                if reused.served:  # taken once, refused again: an agent without reuse
                    resp.release()
                    self._no_reuse[node] = ep.pod_uid
                    return await self.open(method, path, node=node, subject=subject,
                                           operation=operation, query=query,
                                           headers=headers, data=data)
            elif resp.status < 400:
                reused.served += 1
        if resp.status >= 400:
            raise await error_from_response(resp, node)
        return resp


def require_agent(agent: AgentClient | None) -> AgentClient:
    """The client for node agents, or a 503 when this server was started without one."""
    if agent is None:
        raise StatusError(503, "aggapi is not configured to reach node agents "
                               "(--agent-* flags)", retry_after=30)
    return agent


async def error_from_response(resp: aiohttp.ClientResponse, node: str) -> StatusError:
    """Turn an agent's error reply into the StatusError it describes."""
    try:
        body = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        # The agent's answer was cut (it answered as it stopped, then was gone): the
        # client may retry at once either way.
        return StatusError(503, f'aggapi agent on node "{node}" answered {resp.status} and '
                                f"closed: {exc}", retry_after=1)
    finally:
        resp.release()
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        retry = resp.headers.get("Retry-After")
        return StatusError(
            int(status.get("code") or resp.status), str(status.get("message") or ""),
            reason=status.get("reason"), details=status.get("details"),
            retry_after=int(retry) if retry and retry.isdigit() else None,
            headers={h: resp.headers[h] for h in RELAYED_ERROR_HEADERS if h in resp.headers},
        )
    # Auth failures between our own components are our fault, not the user's.
    code = 502 if resp.status in (401, 403) else resp.status
    return StatusError(code, f'aggapi agent on node "{node}" answered {resp.status}: '
                             f"{body[:200].decode(errors='replace')}")
