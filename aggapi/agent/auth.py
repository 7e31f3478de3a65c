"""Who may call the agent: the aggapi apiserver, with mutual TLS and a capability.

The TLS handshake already required a client certificate from aggapi's CA
(CERT_REQUIRED); this middleware checks its CN, then verifies the
``Authorization: Bearer`` capability token, checks that its operation is the
one the route serves, and that its pod is the pod this node runs under that
name (a token for a recreated pod of the same name is refused).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

from aiohttp import web

from aggapi.auth.capability import Capability, CapabilityVerifier
from aggapi.runtime.cri import Sandbox
from aggapi.runtime.errors import RuntimeAccessError
from aggapi.status import StatusError
from aggapi.wire import LABEL_POD_UID

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Per request: the verified capability, set by auth_middleware for the handlers.
CAPABILITY: web.RequestKey[Capability] = web.RequestKey("capability", Capability)


class SandboxLister(Protocol):
    async def list_pod_sandboxes(self, labels: Mapping[str, str] | None = None
                                 ) -> list[Sandbox]: ...


def serving_context(cert: str, key: str) -> ssl.SSLContext:
    """HTTPS with the agent's serving certificate, asking no client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def server_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """HTTPS that refuses any client without a certificate from ``client_ca``."""
    ctx = serving_context(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def peer_common_name(request: web.Request) -> str | None:
    transport = request.transport
    cert: Any = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                return str(value)
    return None


def bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise StatusError(401, "a capability token is required (Authorization: Bearer)")
    return token.strip()


async def check_pod(cri: SandboxLister, cap: Capability) -> None:
    """Refuse a token whose pod uid this node knows under another name.

    The uid is what the apiserver vouches for, and everything the agent does for
    the token is found by that uid. A pod with no sandbox yet is accepted (its
    images are pulled before it exists), and so is one whose name still has an
    older sandbox: a pod deleted and created again under the same name (a
    StatefulSet's, say) while kubelet tears the old one down.
    """
    if not cap.pod_uid:
        return
    for sb in await cri.list_pod_sandboxes({LABEL_POD_UID: cap.pod_uid}):
        if (sb.namespace, sb.name) != (cap.pod_namespace, cap.pod_name):
            raise StatusError(403, f"pod uid {cap.pod_uid} on this node is "
                                   f"{sb.namespace}/{sb.name}, not the token's pod")


def auth_middleware(verifier: CapabilityVerifier, allowed_cns: Collection[str],
                    operations: Mapping[tuple[str, str], str], *,
                    tls_only: Collection[str] = ("/healthz",),
                    cri: SandboxLister | None = None) -> Any:
    """``operations`` maps (method, path) to the capability operation it requires."""
    allowed = frozenset(allowed_cns)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cn = peer_common_name(request)
        if cn is None:
            raise StatusError(401, "a client certificate is required")
        if cn not in allowed:
            raise StatusError(403, f"client certificate CN {cn!r} may not call the agent")
        if request.path in tls_only:
            return await handler(request)
        op = operations.get((request.method, request.path))
        if op is None:
            raise StatusError(404, f"no such agent endpoint: {request.method} {request.path}")
        cap = await verifier.verify_when_known(bearer(request))
        if cap.operation != op:
            raise StatusError(403, f"capability is for {cap.operation!r}, not {op!r}")
        if cri is not None:
            try:
                await check_pod(cri, cap)
            except RuntimeAccessError as err:
                raise StatusError(503, f"cannot check the pod: {err}", retry_after=1) from err
        request[CAPABILITY] = cap
        return await handler(request)

    return middleware
