"""Capability tokens: the apiserver's signed, short-lived permission for one agent call.

The apiserver signs (``CapabilitySigner``), the agent verifies
(``CapabilityVerifier``). A token names the node (``aud``), the user (``sub``),
the pod and its containers with their images, the operation and, for copy, the
path, so the agent needs no Kubernetes API access. Tokens live at most 60 s and
each ``jti`` is accepted once.

Claims: iss, aud, sub, iat, exp, jti, op, pod {namespace, name, uid},
containers [{name, image, kind}], path (copy only), params {str: str}, reuse (true or
absent). The JWT
header's ``kid`` names the signing key (:func:`key_id` of its public half), so an
agent that follows several apiserver replicas' keys (a :class:`KeySet`, filled by
``aggapi.auth.tokenkeys``) knows which one to check with.
"""

from __future__ import annotations

import asyncio
import hashlib
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
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

from aggapi.status import StatusError
from aggapi.wire import OP_NODE_PULLS, OPERATIONS

MAX_LIFETIME = 60  # seconds between iat and exp, by policy
CONTAINER_KINDS = frozenset({"init", "regular", "ephemeral", "imagevolume"})
_ALGORITHMS = ["ES256", "EdDSA"]
# The operations a token may be used for more than once (``reuse``): reading a node's
# view of its pulls names no pod and changes nothing, and the leader reads every node
# polled once a second (a signature per read was a tenth of its event loop).
REUSABLE_OPERATIONS = frozenset({OP_NODE_PULLS})


def _reusable(operation: str, names_pod: bool, containers: tuple[Any, ...],
              path: str | None, params: Mapping[str, Any] | None) -> bool:
    """Whether a token of these claims may carry ``reuse``: a reusable operation that
    names no pod, container, path or parameter (the signer and the verifier both ask)."""
    return (operation in REUSABLE_OPERATIONS and not names_pod and not containers
            and path is None and not params)


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
    reusable: bool = False  # the ``reuse`` claim: the jti may come again until exp

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


def public_pem(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: PublicKeyTypes) -> str:
    """A short, stable name of a public key: sha256 of its SubjectPublicKeyInfo."""
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:32]


class CapabilitySigner:
    """Apiserver side: signs one token per agent request.

    ``private_key`` is a PEM private key (``--token-signing-key-file``) or a key
    object; :meth:`generate` makes one in memory, never written anywhere."""

    def __init__(self, private_key: bytes | PrivateKeyTypes, issuer: str = "aggapi-apiserver",
                 ttl: int = 30, *, clock: Callable[[], float] = time.time) -> None:
        if not 0 < ttl <= MAX_LIFETIME:
            raise ValueError(f"ttl must be in (0, {MAX_LIFETIME}] seconds")
        self._key = (serialization.load_pem_private_key(private_key, password=None)
                     if isinstance(private_key, bytes) else private_key)
        self._alg = _algorithm_for(self._key)
        self.public_key: PublicKeyTypes = self._key.public_key()
        self.key_id = key_id(self.public_key)
        self.issuer = issuer
        self.ttl = ttl
        self._clock = clock

    @classmethod
    def generate(cls, issuer: str = "aggapi-apiserver", ttl: int = 30, *,
                 clock: Callable[[], float] = time.time) -> CapabilitySigner:
        """A signer with a fresh Ed25519 key that exists only in this process."""
        return cls(ed25519.Ed25519PrivateKey.generate(), issuer, ttl, clock=clock)

    def public_key_pem(self) -> bytes:
        return public_pem(self.public_key)

    def now(self) -> float:
        """The signer's clock (``iat`` is its whole second)."""
        return self._clock()

    def sign(self, *, node: str, subject: str, operation: str, pod_namespace: str = "",
             pod_name: str = "", pod_uid: str = "", containers: Iterable[ContainerRef] = (),
             path: str | None = None, params: Mapping[str, str] | None = None,
             reuse: bool = False) -> str:
        """A token for one call, or (``reuse``) for every call of a reusable operation
        on ``node`` by ``subject`` until it expires."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        containers = tuple(containers)
        if reuse and not _reusable(operation, bool(pod_namespace or pod_name or pod_uid),
                                   containers, path, params):
            raise ValueError(f"a {operation!r} token naming a pod, container, path or "
                             "parameter is for one call only")
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
        if reuse:
            claims["reuse"] = True
        return jwt.encode(claims, self._key, algorithm=self._alg,  # type: ignore[arg-type]
                          headers={"kid": self.key_id})


class KeySet:
    """The verification keys an agent currently trusts, by key id.

    Replaced as a whole when the published keys change (``aggapi.auth.tokenkeys``);
    :meth:`wait_for` lets a request whose key was published a moment ago wait for
    the watch to deliver it instead of failing."""

    def __init__(self, keys: Mapping[str, PublicKeyTypes] | None = None) -> None:
        for key in (keys or {}).values():
            _algorithm_for(key)  # only ES256 and EdDSA keys are ever trusted
        self._keys: dict[str, PublicKeyTypes] = dict(keys or {})
        self._changed = asyncio.Event()
        self.loaded = False  # set by the first replace(): the initial list arrived

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, kid: str) -> PublicKeyTypes | None:
        return self._keys.get(kid)

    def ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def replace(self, keys: Mapping[str, PublicKeyTypes]) -> None:
        for key in keys.values():
            _algorithm_for(key)  # only ES256 and EdDSA keys are ever trusted
        self._keys = dict(keys)
        self.loaded = True
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, kid: str, timeout: float) -> bool:
        """True once ``kid`` is known; False after ``timeout`` seconds without it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while kid not in self._keys:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True


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
    """Agent side: verifies signature, issuer, audience (this node), lifetime, jti.

    The key is either one fixed key (``public_key_pem``: a PEM public key or a PEM
    certificate of it, see load_verification_key; any ``kid`` is ignored) or a
    :class:`KeySet` of the replicas' published keys, picked by the token's ``kid``."""

    def __init__(self, public_key_pem: bytes | None, node: str,
                 issuer: str = "aggapi-apiserver",
                 leeway: int = 5, replay_cache_size: int = 100_000, *,
                 keys: KeySet | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if (public_key_pem is None) == (keys is None):
            raise ValueError("give either a public key or a key set")
        self._key = load_verification_key(public_key_pem) if public_key_pem else None
        if self._key is not None:
            _algorithm_for(self._key)
        self.keys = keys
        self.node = node
        self.issuer = issuer
        self.leeway = leeway
        self._clock = clock
        self.replay = ReplayCache(replay_cache_size, clock)

    def _key_id(self, token: str) -> str:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as err:
            raise StatusError(401, f"invalid capability token: {err}") from err
        return kid if isinstance(kid, str) else ""

    def _key_for(self, token: str) -> PublicKeyTypes:
        if self._key is not None:
            return self._key
        assert self.keys is not None
        kid = self._key_id(token)
        key = self.keys.get(kid)
        if key is None:
            raise StatusError(401, f"capability token signed by an unknown key {kid[:32]!r}")
        return key

    async def verify_when_known(self, token: str, wait: float = 3.0) -> Capability:
        """:meth:`verify`, after waiting up to ``wait`` seconds for the token's key to be
        published (a replica that just started signs before every agent's watch saw
        its key)."""
        if self.keys is not None:
            await self.keys.wait_for(self._key_id(token), wait)
        return self.verify(token)

    def verify(self, token: str) -> Capability:
        key = self._key_for(token)
        try:
            claims = jwt.decode(
                token, key, algorithms=[_algorithm_for(key)],  # type: ignore[arg-type]
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
        if cap.reusable:  # checked in _capability: bound as tightly as a single-use one
            return cap
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
            reuse = c.get("reuse", False)
            if not isinstance(reuse, bool):
                raise ValueError("reuse must be a boolean")
            if reuse and not _reusable(op, any(pod.values()), containers, path, params):
                raise ValueError(f"a {op!r} token naming a pod, container, path or "
                                 "parameter cannot be reused")
            return Capability(
                # aud was checked to contain our node name.
                issuer=str(c["iss"]), node=self.node, subject=str(c["sub"]),
                jti=str(c["jti"]), issued_at=int(c["iat"]), expires_at=int(c["exp"]),
                operation=op, pod_namespace=str(pod.get("namespace", "")),
                pod_name=str(pod.get("name", "")), pod_uid=str(pod.get("uid", "")),
                containers=containers, path=None if path is None else str(path),
                params=MappingProxyType({str(k): str(v) for k, v in params.items()}),
                reusable=reuse,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise StatusError(401, f"malformed capability token: {err}") from err
