"""Capability tokens: what the apiserver signs is what the agent accepts, once."""

from __future__ import annotations

import asyncio

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.auth.capability import (
    CapabilitySigner,
    CapabilityVerifier,
    ContainerRef,
    KeySet,
    ReplayCache,
    key_id,
    load_verification_key,
)
from aggapi.status import StatusError
from aggapi.tls import pki


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


# --- keys made in memory, published per replica, picked by kid --------------------------

def _published(*signers: CapabilitySigner) -> KeySet:
    return KeySet({s.key_id: s.public_key for s in signers})


def test_generated_signer_names_its_key_in_the_header() -> None:
    signer = CapabilitySigner.generate()
    token = signer.sign(node="n1", subject="alice", operation="copy.stat")
    assert jwt.get_unverified_header(token) == {"alg": "EdDSA", "kid": signer.key_id,
                                                "typ": "JWT"}
    assert signer.key_id == key_id(load_verification_key(signer.public_key_pem()))
    # A fixed key ignores kid: key files keep working as before.
    assert CapabilityVerifier(signer.public_key_pem(), "n1").verify(token).subject == "alice"


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.sets(st.integers(0, 3)))
def test_a_token_verifies_iff_its_signers_key_is_published(n: int, shown: set[int]) -> None:
    signers = [CapabilitySigner.generate() for _ in range(n)]
    keyset = _published(*(signers[i] for i in shown if i < n))
    verifier = CapabilityVerifier(None, "n1", keys=keyset)
    for i, signer in enumerate(signers):
        token = signer.sign(node="n1", subject=f"u{i}", operation="copy.stat")
        if i in shown:
            assert verifier.verify(token).subject == f"u{i}"
        else:
            with pytest.raises(StatusError) as err:
                verifier.verify(token)
            assert err.value.code == 401 and "unknown key" in str(err.value)


def test_a_replaced_key_set_refuses_the_old_key() -> None:
    old, new = CapabilitySigner.generate(), CapabilitySigner.generate()
    keyset = _published(old)
    verifier = CapabilityVerifier(None, "n1", keys=keyset)
    verifier.verify(old.sign(node="n1", subject="a", operation="copy.stat"))
    keyset.replace({new.key_id: new.public_key})  # the replica restarted
    with pytest.raises(StatusError) as err:
        verifier.verify(old.sign(node="n1", subject="a", operation="copy.stat"))
    assert err.value.code == 401
    verifier.verify(new.sign(node="n1", subject="a", operation="copy.stat"))


def test_a_kid_cannot_pick_another_key_than_the_signers() -> None:
    # A forger names a trusted kid but signs with its own key: the signature fails.
    trusted, forger = CapabilitySigner.generate(), ed25519.Ed25519PrivateKey.generate()
    verifier = CapabilityVerifier(None, "n1", keys=_published(trusted))
    good = jwt.decode(trusted.sign(node="n1", subject="a", operation="copy.stat"),
                      options={"verify_signature": False})
    token = jwt.encode({**good, "jti": "other"}, forger, algorithm="EdDSA",
                       headers={"kid": trusted.key_id})
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401


def test_key_set_refuses_rsa_keys() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa
    with pytest.raises(ValueError):
        KeySet({"x": rsa.generate_private_key(65537, 2048).public_key()})


async def test_verify_when_known_waits_for_a_key_published_a_moment_later() -> None:
    signer = CapabilitySigner.generate()
    keyset = KeySet()
    verifier = CapabilityVerifier(None, "n1", keys=keyset)
    token = signer.sign(node="n1", subject="a", operation="copy.stat")
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, keyset.replace, {signer.key_id: signer.public_key})
    assert (await verifier.verify_when_known(token, wait=3.0)).subject == "a"
    other = CapabilitySigner.generate().sign(node="n1", subject="b", operation="copy.stat")
    t0 = loop.time()
    with pytest.raises(StatusError):
        await verifier.verify_when_known(other, wait=0.3)
    assert 0.25 < loop.time() - t0 < 2.0
