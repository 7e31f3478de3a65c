"""Capability tokens: what the apiserver signs is what the agent accepts, once."""

from __future__ import annotations

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from aggapi import pki
from aggapi.capability import (
    CapabilitySigner,
    CapabilityVerifier,
    ContainerRef,
    ReplayCache,
)
from aggapi.status import StatusError


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def keys() -> tuple[bytes, bytes]:
    key = pki.new_key("ec")
    return pki.private_key_pem(key), pki.public_key_pem(key)


def test_round_trip_carries_every_claim(keys: tuple[bytes, bytes]) -> None:
    signer = CapabilitySigner(keys[0])
    token = signer.sign(node="n1", subject="alice", operation="copy.upload",
                        pod_namespace="ns", pod_name="p", pod_uid="u",
                        containers=[ContainerRef("app", "busybox", "init")], path="/tmp/x",
                        params={"mode": "0644"})
    cap = CapabilityVerifier(keys[1], "n1").verify(token)
    assert (cap.node, cap.subject, cap.operation, cap.path) == ("n1", "alice", "copy.upload",
                                                                "/tmp/x")
    assert (cap.pod_namespace, cap.pod_name, cap.pod_uid) == ("ns", "p", "u")
    assert cap.containers == (ContainerRef("app", "busybox", "init"),)
    assert dict(cap.params) == {"mode": "0644"}
    assert cap.expires_at - cap.issued_at == 30 and len(cap.jti) == 32
    assert jwt.get_unverified_header(token)["alg"] == "ES256"


def test_replayed_token_is_401(keys: tuple[bytes, bytes]) -> None:
    token = CapabilitySigner(keys[0]).sign(node="n1", subject="a", operation="imagepulls")
    verifier = CapabilityVerifier(keys[1], "n1")
    verifier.verify(token)
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401 and "already used" in err.value.message


def test_other_node_is_403_and_bad_signature_401(keys: tuple[bytes, bytes]) -> None:
    token = CapabilitySigner(keys[0]).sign(node="n2", subject="a", operation="imagepulls")
    with pytest.raises(StatusError) as err:
        CapabilityVerifier(keys[1], "n1").verify(token)
    assert err.value.code == 403
    other = pki.public_key_pem(pki.new_key("ec"))
    with pytest.raises(StatusError) as err:
        CapabilityVerifier(other, "n2").verify(token)
    assert err.value.code == 401


def test_expired_and_long_lived_tokens_are_401(keys: tuple[bytes, bytes]) -> None:
    clock = Clock()
    token = CapabilitySigner(keys[0], ttl=10, clock=clock).sign(
        node="n1", subject="a", operation="imagepulls")
    verifier = CapabilityVerifier(keys[1], "n1", leeway=5, clock=clock)
    clock.t += 16
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401
    # Signed with the right key but living 120 s: refused by policy.
    now = int(clock.t)
    long = jwt.encode({"iss": "aggapi-apiserver", "aud": "n1", "sub": "a", "iat": now,
                       "exp": now + 120, "jti": "j1", "op": "imagepulls"},
                      pki.load_pem_key(keys[0]), algorithm="ES256")
    with pytest.raises(StatusError) as err:
        verifier.verify(long)
    assert err.value.code == 401 and "longer than 60s" in err.value.message


def test_unknown_operation_and_wrong_issuer_are_401(keys: tuple[bytes, bytes]) -> None:
    key = pki.load_pem_key(keys[0])
    base = {"aud": "n1", "sub": "a", "iat": 0, "exp": 2**40, "jti": "x"}
    for claims in ({**base, "iss": "aggapi-apiserver", "op": "exec"},
                   {**base, "iss": "someone-else", "op": "imagepulls"}):
        token = jwt.encode(claims, key, algorithm="ES256")
        with pytest.raises(StatusError) as err:
            CapabilityVerifier(keys[1], "n1").verify(token)
        assert err.value.code == 401


def test_eddsa_keys_work() -> None:
    from cryptography.hazmat.primitives import serialization as s

    key = ed25519.Ed25519PrivateKey.generate()
    priv = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    pub = key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    token = CapabilitySigner(priv).sign(node="n1", subject="a", operation="imagepulls")
    assert jwt.get_unverified_header(token)["alg"] == "EdDSA"
    assert CapabilityVerifier(pub, "n1").verify(token).subject == "a"


def test_certificate_of_the_signing_key_is_accepted(keys: tuple[bytes, bytes]) -> None:
    """The chart ships the verification key as a self-signed certificate of the signing
    key (ConfigMap aggapi-token-public): its public key verifies, another's does not."""
    key = pki.load_pem_key(keys[0])
    cert_pem = pki.new_ca("aggapi-token-signing", key=key).cert_pem
    assert cert_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    signer = CapabilitySigner(keys[0])
    assert CapabilityVerifier(cert_pem, "n1").verify(
        signer.sign(node="n1", subject="alice", operation="imagepulls")).subject == "alice"
    # Same for a PEM with text around the block (as `openssl x509 -text` writes).
    noisy = b"Certificate:\n    Data: ...\n" + cert_pem
    assert CapabilityVerifier(noisy, "n1").verify(
        signer.sign(node="n1", subject="bob", operation="imagepulls")).subject == "bob"
    other = pki.new_ca("not-the-signer").cert_pem
    with pytest.raises(StatusError) as err:
        CapabilityVerifier(other, "n1").verify(
            signer.sign(node="n1", subject="a", operation="imagepulls"))
    assert err.value.code == 401


def test_unusable_verification_material_is_refused() -> None:
    rsa_cert = pki.new_ca("rsa", key=pki.new_key("rsa")).cert_pem  # not P-256 / Ed25519
    for pem in (b"not a key", pki.private_key_pem(pki.new_key("ec")), rsa_cert):
        with pytest.raises(ValueError):
            CapabilityVerifier(pem, "n1")


def test_replay_cache_forgets_expired_and_is_bounded() -> None:
    clock = Clock()
    cache = ReplayCache(2, clock)
    assert cache.add("a", int(clock.t) + 10) and cache.add("b", int(clock.t) + 20)
    assert not cache.add("a", int(clock.t) + 10)
    with pytest.raises(StatusError) as err:  # full of live entries: fail closed
        cache.add("c", int(clock.t) + 10)
    assert err.value.code == 503
    clock.t += 11
    assert cache.add("c", int(clock.t) + 10)  # "a" expired and was dropped
    assert len(cache) == 2
