"""Per-node agent serving identities, attested by Kubernetes, with no shared key.

With one serving certificate for every agent, the key on any node could answer for any
other node. Instead each agent makes a P-256 key in memory at start and serves a
self-signed certificate of it (:func:`new_identity`). To publish it, the agent creates a
CertificateSigningRequest (signer ``aggapi.io/agent-identity``, never approved nor
signed) whose PKCS#10 request is signed by that key and carries the certificate as an
attribute (:func:`csr_object`). kube-apiserver itself writes who created a CSR into
``spec.username``/``spec.extra``; for a pod's ServiceAccount token that includes the
pod's uid and node name (``authentication.kubernetes.io/pod-uid``, ``node-name``). The
apiserver (:class:`IdentityPins`) trusts a certificate for pod P on node N only from a
CSR made by the agent ServiceAccount with P's bound token on N, whose request is signed
by the certificate's own key; it then dials P's address trusting that certificate alone.
An agent can only present its own pod's token (the kubelet mounts it; the agent may not
request tokens), so node X's agent cannot get a certificate pinned for node Y's pod.

kube-controller-manager deletes pending CSRs after 24 h, so the agent creates a new one
every 12 h (:class:`IdentityPublisher`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import logging
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from aggapi.kube.client import KubeClient, keep_publishing
from aggapi.kube.informer import Informer

log = logging.getLogger(__name__)

SIGNER = "aggapi.io/agent-identity"
LABEL = "aggapi.io/agent-identity"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
SERVER_NAME = "aggapi-agent"
# A UUID-based OID (X.667 arc 2.25, no registration needed): the attribute of the
# request that holds the agent's certificate (base64 DER).
CERT_ATTRIBUTE = ObjectIdentifier("2.25.214823402374810452830923985730914860771")
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
REPUBLISH_EVERY = 12 * 3600.0


@dataclass(frozen=True)
class Identity:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def server_context(self, client_ca: str | None = None) -> ssl.SSLContext:
        """HTTPS serving this identity; with ``client_ca``, client certificates required.
        The key goes through a memfd, never a file system."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        fd = os.memfd_create("aggapi-agent-identity", os.MFD_CLOEXEC)
        try:
            os.write(fd, self.cert_pem + self.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()))
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        if client_ca:
            ctx.load_verify_locations(cafile=client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def new_identity(node: str, days: int = 365) -> Identity:
    """A fresh key and a self-signed certificate of it (SAN ``aggapi-agent``, CN node)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return Identity(key, cert)


def csr_object(identity: Identity, node: str, key_set: str) -> dict[str, Any]:
    """The CertificateSigningRequest publishing ``identity``: its request is signed by
    the identity's key and carries the certificate."""
    der = identity.cert.public_bytes(serialization.Encoding.DER)
    req = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
           .add_attribute(CERT_ATTRIBUTE, base64.b64encode(der))
           .sign(identity.key, hashes.SHA256()))
    pem = req.public_bytes(serialization.Encoding.PEM)
    return {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"generateName": f"aggapi-agent-{node[:200]}-",
                         "labels": {LABEL: key_set}},
            "spec": {"request": base64.b64encode(pem).decode(), "signerName": SIGNER,
                     "usages": ["digital signature", "server auth"]}}


@dataclass(frozen=True)
class Pin:
    node: str
    cert_pem: bytes
    created: str  # the CSR's creationTimestamp: the newest pin of a pod wins


def pin_of(csr: Mapping[str, Any], *, username: str) -> tuple[str, Pin] | str:
    """(pod uid, pin) of a CSR an agent made, or why it proves nothing."""
    spec = csr.get("spec") or {}
    if spec.get("signerName") != SIGNER:
        return "another signer"
    if spec.get("username") != username:
        return f"made by {spec.get('username')!r}, not {username!r}"
    extra = spec.get("extra") or {}
    uids, nodes = extra.get(POD_UID) or [], extra.get(NODE_NAME) or []
    if len(uids) != 1 or len(nodes) != 1:
        return "not made with a pod-bound token naming its node"
    try:
        req = x509.load_pem_x509_csr(base64.b64decode(spec.get("request") or ""))
        if not req.is_signature_valid:
            return "request signature invalid"
        attr = req.attributes.get_attribute_for_oid(CERT_ATTRIBUTE).value
        cert = x509.load_der_x509_certificate(base64.b64decode(attr))
    except (ValueError, TypeError, x509.AttributeNotFound) as exc:
        return f"malformed request: {exc}"
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != req.public_key().public_bytes(*spki):
        return "the certificate is not of the request's key"
    created = str((csr.get("metadata") or {}).get("creationTimestamp") or "")
    return str(uids[0]), Pin(str(nodes[0]), cert.public_bytes(serialization.Encoding.PEM),
                             created)


class PinIndex:
    """pod uid -> the newest pin, kept per CSR event: an event parses its own CSR only
    (a request's signature check is about 240 us; 5,000 agents' CSRs reparsed on every
    event stalled the event loop for seconds)."""

    def __init__(self, username: str) -> None:
        self._username = username
        # CSR name -> (its resourceVersion, what it proves: (uid, pin), or None)
        self._parsed: dict[str, tuple[str, tuple[str, Pin] | None]] = {}
        self._by_uid: dict[str, set[str]] = {}  # uid -> names of the CSRs pinning it
        self.pins: dict[str, Pin] = {}

    def _parse(self, name: str, csr: Mapping[str, Any]) -> tuple[str, Pin] | None:
        version = str((csr.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._parsed.get(name)
        if cached is not None and version and cached[0] == version:
            return cached[1]
        got = pin_of(csr, username=self._username)
        if isinstance(got, str):
            log.debug("CSR %s is no agent identity: %s", name, got)
            got_pin = None
        else:
            got_pin = got
        self._parsed[name] = (version, got_pin)
        return got_pin

    def _newest(self, uid: str) -> None:
        best: Pin | None = None
        best_key = ("", "")
        for name in self._by_uid.get(uid, ()):
            got = self._parsed[name][1]
            # the newest; of two made the same second, the one with the greater name
            if got is not None and (best is None or (got[1].created, name) > best_key):
                best, best_key = got[1], (got[1].created, name)
        if best is None:
            self._by_uid.pop(uid, None)
            self.pins.pop(uid, None)
        else:
            self.pins[uid] = best

    def apply(self, kind: str, csr: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of one CSR."""
        name = str((csr.get("metadata") or {}).get("name") or "")
        old = self._parsed.get(name)
        old_uid = old[1][0] if old is not None and old[1] is not None else None
        if kind == "DELETED":
            self._parsed.pop(name, None)
            got = None
        else:
            got = self._parse(name, csr)  # the cached result if the CSR did not change
        new_uid = got[0] if got is not None else None
        if old_uid is not None and old_uid != new_uid:
            self._by_uid.get(old_uid, set()).discard(name)
        if new_uid is not None:
            self._by_uid.setdefault(new_uid, set()).add(name)
        for uid in {old_uid, new_uid} - {None}:
            assert uid is not None
            self._newest(uid)

    def relist(self, csrs: Iterable[Mapping[str, Any]]) -> None:
        """The whole set after a relist: only CSRs new or changed since are parsed."""
        old = self._parsed
        self._parsed, self._by_uid, self.pins = {}, {}, {}
        for csr in csrs:
            name = str((csr.get("metadata") or {}).get("name") or "")
            if name in old:
                self._parsed[name] = old[name]
            got = self._parse(name, csr)
            if got is not None:
                self._by_uid.setdefault(got[0], set()).add(name)
        for uid in list(self._by_uid):
            self._newest(uid)


class IdentityPins:
    """Apiserver side: pod uid -> the certificate its agent published, from the CSRs of
    one key set, and the TLS context that trusts only that certificate."""

    def __init__(self, api: KubeClient, *, key_set: str, namespace: str,
                 service_account: str, client_cert: str, client_key: str) -> None:
        self._client = (client_cert, client_key)
        self._index = PinIndex(f"system:serviceaccount:{namespace}:{service_account}")
        self._contexts: dict[bytes, ssl.SSLContext] = {}
        self._informer = Informer(api, CSRS, {"labelSelector": f"{LABEL}={key_set}"})
        self._informer.add_listener(self._changed)

    def _changed(self, kind: str, csr: Mapping[str, Any]) -> None:
        if kind == "RELIST":
            self._index.relist(self._informer.items.values())
        else:
            self._index.apply(kind, csr)

    def start(self) -> None:
        self._informer.start()

    async def stop(self) -> None:
        await self._informer.stop()

    @property
    def synced(self) -> bool:
        return self._informer.synced.is_set()

    def pin(self, pod_uid: str, node: str) -> Pin | None:
        pin = self._index.pins.get(pod_uid)
        return pin if pin is not None and pin.node == node else None

    def context(self, pod_uid: str, node: str) -> ssl.SSLContext | None:
        """TLS towards ``pod_uid``'s agent on ``node``, trusting its certificate alone;
        None while it has published none (or one for another node)."""
        pin = self.pin(pod_uid, node)
        if pin is None:
            return None
        ctx = self._contexts.get(pin.cert_pem)
        if ctx is None:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                             cadata=pin.cert_pem.decode())
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(*self._client)
            if len(self._contexts) > 4096:  # old agents' contexts
                self._contexts.clear()
            self._contexts[pin.cert_pem] = ctx
        return ctx


def fingerprint(cert_pem: bytes) -> str:
    return hashlib.sha256(x509.load_pem_x509_certificate(cert_pem).public_bytes(
        serialization.Encoding.DER)).hexdigest()


class IdentityPublisher:
    """Agent side: create the CSR publishing this agent's identity now, and again every
    ``every`` seconds (pending CSRs are deleted after 24 h)."""

    def __init__(self, api: KubeClient, identity: Identity, *, node: str, key_set: str,
                 every: float = REPUBLISH_EVERY) -> None:
        self._api = api
        self.object = csr_object(identity, node, key_set)
        self._every = every
        self.published = asyncio.Event()

    async def run(self) -> None:
        await keep_publishing(self._publish_once, self._every, "the agent identity", log)

    async def _publish_once(self) -> None:
        created = await self._api.post(CSRS, self.object)
        self.published.set()
        log.info("published the agent identity", extra={
            "csr": (created.get("metadata") or {}).get("name", "")})

    async def check(self) -> None:
        """For /readyz: the apiservers cannot reach an agent before it published."""
        if not self.published.is_set():
            raise RuntimeError("agent identity not published yet")
