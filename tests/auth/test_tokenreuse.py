"""Reusable capability tokens (the leader's node-view polls): taken again until they
expire, bound exactly as a single-use token (node, subject, operation, lifetime), and
never for anything that names a pod, container, path or parameter."""

from __future__ import annotations

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.auth.capability import CapabilitySigner, CapabilityVerifier, ContainerRef
from aggapi.auth.tokenreuse import ReusedTokens
from aggapi.status import StatusError
from aggapi.tls import pki
from aggapi.wire import OP_COPY_DOWNLOAD, OP_LINK_PEERS, OP_NODE_PULLS, OP_PROGRESS
from tests.auth.test_capability import Clock

KEY = pki.new_key("ec")
PRIV, PUB = pki.private_key_pem(KEY), pki.public_key_pem(KEY)


def _pair(ttl: int = 30) -> tuple[Clock, CapabilitySigner, CapabilityVerifier]:
    clock = Clock()
    return (clock, CapabilitySigner(PRIV, ttl=ttl, clock=clock),
            CapabilityVerifier(PUB, "n1", leeway=5, clock=clock))


def test_a_reusable_token_is_taken_again_until_it_expires() -> None:
    clock, signer, verifier = _pair()
    token = signer.sign(node="n1", subject="aggapi:collections", operation=OP_NODE_PULLS,
                        reuse=True)
    first = verifier.verify(token)
    for _ in range(20):
        clock.t += 1
        assert verifier.verify(token) == first
    assert first.reusable and first.operation == OP_NODE_PULLS and first.node == "n1"
    assert len(verifier.replay) == 0  # not in the single-use cache: it cannot fill it
    clock.t += 16  # 36 s after iat: past exp (30) and the leeway (5)
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401 and "expired" in err.value.message


def test_a_reusable_token_is_bound_to_its_node() -> None:
    _, signer, verifier = _pair()
    token = signer.sign(node="n2", subject="s", operation=OP_NODE_PULLS, reuse=True)
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 403


def test_single_use_tokens_stay_single_use() -> None:
    _, signer, verifier = _pair()
    token = signer.sign(node="n1", subject="s", operation=OP_NODE_PULLS)
    assert not verifier.verify(token).reusable
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401 and "already used" in err.value.message


@pytest.mark.parametrize("kw", [
    {"operation": OP_PROGRESS}, {"operation": OP_COPY_DOWNLOAD}, {"operation": OP_LINK_PEERS},
    {"pod_uid": "u"}, {"pod_name": "p"}, {"pod_namespace": "ns"},
    {"containers": [ContainerRef("c", "img")]}, {"path": "/x"}, {"params": {"a": "b"}},
])
def test_the_signer_makes_no_reusable_token_naming_more(kw: dict[str, object]) -> None:
    _, signer, _ = _pair()
    args: dict[str, object] = {"node": "n1", "subject": "s", "operation": OP_NODE_PULLS, **kw}
    with pytest.raises(ValueError):
        signer.sign(**args, reuse=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("extra", [
    {"op": OP_PROGRESS}, {"op": OP_COPY_DOWNLOAD},
    {"pod": {"namespace": "ns", "name": "p", "uid": "u"}},
    {"containers": [{"name": "c", "image": "i"}]}, {"path": "/etc"}, {"params": {"a": "b"}},
    {"reuse": "yes"}, {"reuse": 1},
])
def test_the_agent_refuses_a_reuse_claim_on_anything_else(extra: dict[str, object]) -> None:
    """A token signed with the right key by something other than our signer (or a future
    bug in it): a reuse claim beside a pod, a path or another operation is refused, not
    taken as single-use or as reusable."""
    clock, _, verifier = _pair()
    now = int(clock.t)
    claims = {"iss": "aggapi-apiserver", "aud": "n1", "sub": "s", "iat": now,
              "exp": now + 30, "jti": "j", "op": OP_NODE_PULLS, "reuse": True, **extra}
    token = jwt.encode(claims, pki.load_pem_key(PRIV), algorithm="ES256")
    with pytest.raises(StatusError) as err:
        verifier.verify(token)
    assert err.value.code == 401


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=7.5), min_size=1, max_size=60),
       st.sampled_from([10, 30, 60]))
def test_a_token_handed_out_has_half_its_life_left_and_is_signed_seldom(
        steps: list[float], ttl: int) -> None:
    """Whenever the cache hands a token out, the agent takes it for more than ttl/2 s
    more (a poll in flight under load arrives valid), and it signs at most once per
    (ttl/2 - 1) s of its clock, not once per call."""
    clock, signer, verifier = _pair(ttl)
    cache = ReusedTokens(signer)
    start = clock.t
    for step in steps:
        clock.t += step
        got = cache.get(node="n1", subject="s", operation=OP_NODE_PULLS)
        cap = verifier.verify(got.token)
        assert cap.expires_at - clock.t > ttl / 2
        assert (cap.node, cap.subject, cap.operation) == ("n1", "s", OP_NODE_PULLS)
    assert cache.signed <= 1 + (clock.t - start) / (ttl / 2 - 1)


def test_the_cache_keeps_one_token_per_node_and_forgets_refused_and_old_ones() -> None:
    clock, signer, _ = _pair()
    cache = ReusedTokens(signer)
    a = cache.get(node="n1", subject="s", operation=OP_NODE_PULLS)
    assert cache.get(node="n1", subject="s", operation=OP_NODE_PULLS) is a
    b = cache.get(node="n2", subject="s", operation=OP_NODE_PULLS)
    assert b.token != a.token and cache.signed == 2
    cache.forget("n1", "s", OP_NODE_PULLS)
    assert cache.get(node="n1", subject="s", operation=OP_NODE_PULLS) is not a
    clock.t += 100  # every token past its time: swept at the next signature
    cache.get(node="n3", subject="s", operation=OP_NODE_PULLS)
    assert len(cache) == 1
