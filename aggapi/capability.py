"""Capability tokens: the apiserver's signed, short-lived permission for one agent call.

The apiserver signs (``CapabilitySigner``), the agent verifies
(``CapabilityVerifier``). A token names the node (``aud``), the user (``sub``),
the pod and its containers with their images, the operation and, for copy, the
path, so the agent needs no Kubernetes API access. Tokens live at most 60 s and
each ``jti`` is accepted once.

Claims: iss, aud, sub, iat, exp, jti, op, pod {namespace, name, uid},
containers [{name, image, kind}], path (copy only), params {str: str}.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from aggapi.status import StatusError
from aggapi.wire import OPERATIONS

MAX_LIFETIME = 60  # seconds between iat and exp, by policy
CONTAINER_KINDS = frozenset({"init", "regular", "ephemeral", "imagevolume"})
_ALGORITHMS = ["ES256", "EdDSA"]


@dataclass(frozen=True)
class ContainerRef:
    name: str
    image: str  # the pod spec's image reference, as written
    kind: str = "regular"  # "init" | "regular" | "ephemeral" | "imagevolume"


@dataclass(frozen=True)
class Capability:
    issuer: str
    node: str  # aud
    subject: str  # sub
    jti: str
    issued_at: int
    expires_at: int
    operation: str
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    containers: tuple[ContainerRef, ...] = ()
    path: str | None = None  # copy only
    params: Mapping[str, str] = field(default_factory=dict)

    def container(self, name: str) -> ContainerRef | None:
        return next((c for c in self.containers if c.name == name), None)


def _algorithm_for(key: Any) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if key.curve.name != "secp256r1":
            raise ValueError("capability keys must be P-256 (ES256) or Ed25519")
        return "ES256"
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "EdDSA"
    raise ValueError("capability keys must be P-256 (ES256) or Ed25519")


def load_verification_key(pem: bytes) -> PublicKeyTypes:
    """The public key in ``pem``: a bare public key (``BEGIN PUBLIC KEY``) or an X.509
    certificate (``BEGIN CERTIFICATE``) of it, as the helm chart ships (helm cannot write a
    bare public key). The certificate is only a container: its validity, issuer and
    extensions are not checked, and the first certificate of a bundle is used."""
    if b"-----BEGIN CERTIFICATE-----" in pem:
        return x509.load_pem_x509_certificate(pem).public_key()
    return serialization.load_pem_public_key(pem)


class CapabilitySigner:
    """Apiserver side: signs one token per agent request."""

    def __init__(self, private_key_pem: bytes, issuer: str = "aggapi-apiserver",
                 ttl: int = 30, *, clock: Callable[[], float] = time.time) -> None:
        if not 0 < ttl <= MAX_LIFETIME:
            raise ValueError(f"ttl must be in (0, {MAX_LIFETIME}] seconds")
        self._key = serialization.load_pem_private_key(private_key_pem, password=None)
        self._alg = _algorithm_for(self._key)
        self.issuer = issuer
        self.ttl = ttl
        self._clock = clock

    def sign(self, *, node: str, subject: str, operation: str, pod_namespace: str = "",
             pod_name: str = "", pod_uid: str = "", containers: Iterable[ContainerRef] = (),
             path: str | None = None, params: Mapping[str, str] | None = None) -> str:
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        iat = int(self._clock())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": node,
            "sub": subject,
            "iat": iat,
            "exp": iat + self.ttl,
            "jti": uuid.uuid4().hex,
            "op": operation,
            "pod": {"namespace": pod_namespace, "name": pod_name, "uid": pod_uid},
            "containers": [{"name": c.name, "image": c.image, "kind": c.kind}
                           for c in containers],
        }
        if path is not None:
            claims["path"] = path
        if params:
            claims["params"] = {str(k): str(v) for k, v in params.items()}
        return jwt.encode(claims, self._key, algorithm=self._alg)  # type: ignore[arg-type]


class ReplayCache:
    """Seen ``jti`` values until their token expires; bounded.

    When full of unexpired entries it refuses new tokens (fail closed) rather
    than forgetting one, which would make that token replayable.
    """

    def __init__(self, max_size: int, clock: Callable[[], float] = time.time) -> None:
        self.max_size = max_size
        self._clock = clock
        self._expiry: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def _purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            exp, jti = heapq.heappop(self._heap)
            if self._expiry.get(jti) == exp:
                del self._expiry[jti]

    def add(self, jti: str, expires_at: int) -> bool:
        """Record ``jti``; False if it was already seen (a replay)."""
        self._purge(self._clock())
        if jti in self._expiry:
            return False
        if len(self._expiry) >= self.max_size:
            raise StatusError(503, "too many capability tokens in flight", retry_after=1)
        self._expiry[jti] = expires_at
        heapq.heappush(self._heap, (expires_at, jti))
        return True


class CapabilityVerifier:
    """Agent side: verifies signature, issuer, audience (this node), lifetime, jti."""

    def __init__(self, public_key_pem: bytes, node: str, issuer: str = "aggapi-apiserver",
                 leeway: int = 5, replay_cache_size: int = 100_000, *,
                 clock: Callable[[], float] = time.time) -> None:
        # A PEM public key or a PEM certificate of it (load_verification_key).
        self._key = load_verification_key(public_key_pem)
        self._alg = _algorithm_for(self._key)
        self.node = node
        self.issuer = issuer
        self.leeway = leeway
        self._clock = clock
        self.replay = ReplayCache(replay_cache_size, clock)

    def verify(self, token: str) -> Capability:
        try:
            claims = jwt.decode(
                token, self._key, algorithms=[self._alg],  # type: ignore[arg-type]
                audience=self.node, issuer=self.issuer, leeway=self.leeway,
                # Times are checked below against our clock (injectable for tests).
                options={"require": ["iss", "aud", "sub", "iat", "exp", "jti"],
                         "verify_iat": False, "verify_exp": False, "verify_nbf": False},
            )
        except jwt.InvalidAudienceError as err:
            raise StatusError(403, f"capability token is not for node {self.node!r}") from err
        except jwt.PyJWTError as err:
            raise StatusError(401, f"invalid capability token: {err}") from err
        cap = self._capability(claims)
        now = self._clock()
        if cap.expires_at - cap.issued_at > MAX_LIFETIME:
            raise StatusError(401, f"capability token lives longer than {MAX_LIFETIME}s")
        if cap.expires_at + self.leeway < now:
            raise StatusError(401, "capability token expired")
        if cap.issued_at > now + self.leeway:
            raise StatusError(401, "capability token issued in the future")
        # Only after the signature checked out, so forged tokens cannot fill the cache.
        if not self.replay.add(cap.jti, cap.expires_at + self.leeway):
            raise StatusError(401, "capability token already used")
        return cap

    def _capability(self, c: Mapping[str, Any]) -> Capability:
        try:
            op = str(c["op"])
            if op not in OPERATIONS:
                raise ValueError(f"unknown operation {op!r}")
            pod = c.get("pod") or {}
            containers = tuple(
                ContainerRef(name=str(x["name"]), image=str(x.get("image", "")),
                             kind=str(x.get("kind", "regular")))
                for x in c.get("containers") or ()
            )
            if any(x.kind not in CONTAINER_KINDS for x in containers):
                raise ValueError("unknown container kind")
            path = c.get("path")
            params = c.get("params") or {}
            if not isinstance(params, dict):
                raise ValueError("params must be an object")
            return Capability(
                # aud was checked to contain our node name.
                issuer=str(c["iss"]), node=self.node, subject=str(c["sub"]),
                jti=str(c["jti"]), issued_at=int(c["iat"]), expires_at=int(c["exp"]),
                operation=op, pod_namespace=str(pod.get("namespace", "")),
                pod_name=str(pod.get("name", "")), pod_uid=str(pod.get("uid", "")),
                containers=containers, path=None if path is None else str(path),
                params=MappingProxyType({str(k): str(v) for k, v in params.items()}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise StatusError(401, f"malformed capability token: {err}") from err
