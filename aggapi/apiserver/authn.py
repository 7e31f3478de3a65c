"""Authentication, in kube-apiserver's order for extension servers.

1. front-proxy request headers (X-Remote-*), only from a peer whose certificate
   was issued by the requestheader CA and whose CN is allowed;
2. a client certificate issued by the client CA (CN = user, O = groups);
3. a bearer token, via TokenReview (cached);
4. anonymous, if enabled, and only on the paths given (the probes, which skip
   authentication anyway, and ``/metrics`` with ``--always-allow-metrics``): an
   unauthenticated request anywhere else is a 401, never a SubjectAccessReview for
   ``system:anonymous``, so an RBAC binding to it cannot open the subresources.

As in k8s.io/apiserver's union authenticator, the first success wins and a
failure (e.g. a certificate nobody trusts) is a 401 only when nothing succeeds.
One addition: a request carrying identity headers that were not honoured is a
401, never an anonymous request, so a spoofed ``X-Remote-User`` cannot pass as
anything. ``system:authenticated`` is added to every authenticated user.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
import urllib.parse
from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aggapi.apiserver.authconfig import AuthConfig, AuthConfigSource
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.user import USER, UserInfo, anonymous
from aggapi.auth.delegated import AuthenticationFailed, TokenReviewer, bearer_token
from aggapi.status import Handler, StatusError

log = logging.getLogger(__name__)

# Paths served to anyone: probes must not depend on the control plane.
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
# Where an anonymous request may go by default: the probes alone.
ANONYMOUS_PATHS = UNAUTHENTICATED_PATHS


def _cn(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def _orgs(cert: x509.Certificate) -> tuple[str, ...]:
    return tuple(str(a.value) for a in
                 cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))


def _allows_client_auth(cert: x509.Certificate) -> bool:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ExtendedKeyUsageOID.CLIENT_AUTH in eku or \
        ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in eku


def _issuer_in(cert: x509.Certificate, cas: Sequence[x509.Certificate]) -> x509.Certificate | None:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca
    return None


def _within_validity(now: dt.datetime, *certs: x509.Certificate) -> bool:
    return all(c.not_valid_before_utc <= now <= c.not_valid_after_utc for c in certs)


@dataclass
class _PeerCheck:
    """What a peer certificate proves; validity times are checked per request."""
    cert: x509.Certificate
    requestheader_ca: x509.Certificate | None
    client_ca: x509.Certificate | None
    client_auth: bool = field(default=True)


class Authenticator:
    def __init__(self, source: AuthConfigSource, tokens: TokenReviewer, metrics: Metrics, *,
                 anonymous_enabled: bool = True,
                 anonymous_paths: Container[str] = ANONYMOUS_PATHS,
                 extra_client_cas: Sequence[x509.Certificate] = ()) -> None:
        self.source = source
        self.tokens = tokens
        self.metrics = metrics
        self.anonymous_enabled = anonymous_enabled
        self.anonymous_paths = anonymous_paths
        self.extra_client_cas = tuple(extra_client_cas)
        self._peer_cache: OrderedDict[bytes, _PeerCheck] = OrderedDict()
        self._peer_cfg: AuthConfig | None = None

    def _check_peer(self, der: bytes, cfg: AuthConfig) -> _PeerCheck:
        # Certificate parsing and signature checks are cached per config, since a
        # front proxy presents the same certificate on every request.
        if cfg is not self._peer_cfg:
            self._peer_cache.clear()
            self._peer_cfg = cfg
        check = self._peer_cache.get(der)
        if check is None:
            cert = x509.load_der_x509_certificate(der)
            check = _PeerCheck(cert, _issuer_in(cert, cfg.requestheader_cas),
                               _issuer_in(cert, cfg.client_cas + self.extra_client_cas),
                               _allows_client_auth(cert))
            self._peer_cache[der] = check
            if len(self._peer_cache) > 1024:
                self._peer_cache.popitem(last=False)
        return check

    def _from_headers(self, request: web.Request, cfg: AuthConfig) -> UserInfo | None:
        name = next((v for h in cfg.username_headers
                     if (v := request.headers.get(h, "").strip())), "")
        if not name:
            return None
        uid = next((v for h in cfg.uid_headers if (v := request.headers.get(h, "").strip())), "")
        groups = tuple(g for h in cfg.group_headers for g in request.headers.getall(h, ()))
        extra: dict[str, list[str]] = {}
        for header, value in request.headers.items():
            low = header.lower()
            for prefix in cfg.extra_prefixes:
                if low.startswith(prefix.lower()) and len(low) > len(prefix):
                    key = urllib.parse.unquote(header[len(prefix):]).lower()
                    extra.setdefault(key, []).append(value)
                    break
        return UserInfo(name, uid, groups, {k: tuple(v) for k, v in extra.items()})

    def _has_identity_headers(self, request: web.Request, cfg: AuthConfig) -> bool:
        names = cfg.username_headers or ("X-Remote-User",)
        return any(h in request.headers for h in names)

    async def authenticate(self, request: web.Request) -> UserInfo:
        try:
            return await self._authenticate(request)
        except AuthenticationFailed as exc:
            self.metrics.authn_failures.labels(exc.reason).inc()
            log.info("authentication failed", extra={"reason": exc.reason,
                                                     "detail": str(exc)})
            raise StatusError(401, "Unauthorized") from exc

    async def _authenticate(self, request: web.Request) -> UserInfo:
        cfg = self.source.current
        if cfg is None:
            raise StatusError(503, "authentication configuration not loaded yet",
                              retry_after=1)
        failures: list[AuthenticationFailed] = []
        now = dt.datetime.now(dt.UTC)
        der = _peer_der(request)
        if der is not None:
            check = self._check_peer(der, cfg)
            cert = check.cert
            # 1. front proxy
            if check.requestheader_ca is not None:
                if not check.client_auth or not _within_validity(now, cert,
                                                                 check.requestheader_ca):
                    failures.append(AuthenticationFailed(
                        "cert_invalid", "front-proxy certificate expired or not for client auth"))
                elif cfg.allowed_names and _cn(cert) not in cfg.allowed_names:
                    failures.append(AuthenticationFailed(
                        "requestheader_name_not_allowed",
                        f"front-proxy CN {_cn(cert)!r} is not in requestheader-allowed-names"))
                else:
                    user = self._from_headers(request, cfg)
                    if user is not None:
                        return user.with_authenticated()
            # 2. client certificate
            if check.client_ca is not None:
                if check.client_auth and _within_validity(now, cert, check.client_ca):
                    if not self._has_identity_headers(request, cfg):
                        return UserInfo(_cn(cert), "", _orgs(cert)).with_authenticated()
                else:
                    failures.append(AuthenticationFailed(
                        "cert_invalid", "client certificate expired or not for client auth"))
            elif check.requestheader_ca is None:
                failures.append(AuthenticationFailed(
                    "unknown_authority", "client certificate signed by unknown authority"))
            elif not failures:
                # A front-proxy certificate without a user header: as kube's x509
                # authenticator, refuse rather than fall through to anonymous.
                failures.append(AuthenticationFailed(
                    "requestheader_missing_user", "front-proxy request without a user header"))
        # 3. bearer token
        token = bearer_token(request)
        if token:
            try:
                user = await self.tokens.review(token)
            except AuthenticationFailed as exc:
                failures.append(exc)
            else:
                if not self._has_identity_headers(request, cfg):
                    return user.with_authenticated()
        if failures:
            raise failures[0]
        if self._has_identity_headers(request, cfg):
            raise AuthenticationFailed("untrusted_identity_headers",
                                       "identity headers from an untrusted peer")
        # 4. anonymous
        if not self.anonymous_enabled:
            raise AuthenticationFailed("anonymous_disabled", "anonymous requests are disabled")
        if request.path not in self.anonymous_paths:
            raise AuthenticationFailed("anonymous_path",
                                       "anonymous requests are allowed on health paths only")
        return anonymous()


def _peer_der(request: web.Request) -> bytes | None:
    transport = request.transport
    if transport is None:
        return None
    sslobj: ssl.SSLObject | None = transport.get_extra_info("ssl_object")
    if sslobj is None:
        return None
    return sslobj.getpeercert(binary_form=True)


def authn_middleware(authenticator: Authenticator) -> Middleware:
    """Sets ``USER`` on every request but the probes, or answers 401."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in UNAUTHENTICATED_PATHS:
            request[USER] = await authenticator.authenticate(request)
        return await handler(request)

    return authenticate
