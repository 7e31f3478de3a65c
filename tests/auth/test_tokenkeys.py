"""Published token keys: each replica's in-memory key reaches the agents as a ConfigMap
owned by its pod, is replaced when the replica restarts, and only valid keys count."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from aggapi.auth import tokenkeys
from aggapi.auth.capability import CapabilitySigner, CapabilityVerifier, key_id, public_pem
from aggapi.kube.client import KubeClient
from aggapi.status import StatusError
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

NS, SET = "aggapi", "aggapi"


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    k = FakeKube()
    k.writable = {"configmaps"}
    await k.start()
    clients: list[KubeClient] = []
    make = k.kube_client

    def tracked() -> KubeClient:
        clients.append(make())
        return clients[-1]

    k.kube_client = tracked  # type: ignore[method-assign]
    yield k
    for c in clients:
        await c.close()
    await k.stop()


def publisher(kube: FakeKube, signer: CapabilitySigner, pod: str = "api-1",
              uid: str = "uid-1", recheck: float = 30.0) -> tokenkeys.KeyPublisher:
    return tokenkeys.KeyPublisher(kube.kube_client(), signer, namespace=NS, pod_name=pod,
                                  pod_uid=uid, key_set=SET, recheck=recheck)


async def test_publishes_only_the_public_key_owned_by_the_pod(kube: FakeKube) -> None:
    signer = CapabilitySigner.generate()
    pub = publisher(kube, signer)
    assert not pub.published.is_set()
    await pub.publish_once()
    assert pub.published.is_set()
    cm = kube.get("api/v1", "configmaps", NS, "api-1-token-key")
    assert cm is not None
    assert cm["metadata"]["labels"] == {tokenkeys.LABEL: SET}
    assert cm["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "api-1", "uid": "uid-1"}]
    assert cm["data"] == {"public-key.pem": signer.public_key_pem().decode(),
                          "key-id": signer.key_id}
    assert "PRIVATE" not in str(cm)


async def test_a_restarted_replica_replaces_its_key(kube: FakeKube) -> None:
    watch = tokenkeys.KeyWatch(kube.kube_client(), namespace=NS, key_set=SET)
    watch.start()
    try:
        first, second = CapabilitySigner.generate(), CapabilitySigner.generate()
        other = CapabilitySigner.generate()
        await publisher(kube, first).publish_once()
        await publisher(kube, other, pod="api-2", uid="uid-2").publish_once()
        await until(lambda: watch.keys.ids() == {first.key_id, other.key_id})
        verifier = CapabilityVerifier(None, "n1", keys=watch.keys)
        verifier.verify(first.sign(node="n1", subject="a", operation="copy.stat"))
        # The same pod's container restarts: a new key over the old ConfigMap.
        await publisher(kube, second).publish_once()
        await until(lambda: watch.keys.ids() == {second.key_id, other.key_id})
        with pytest.raises(StatusError) as err:
            verifier.verify(first.sign(node="n1", subject="a", operation="copy.stat"))
        assert err.value.code == 401
        verifier.verify(second.sign(node="n1", subject="a", operation="copy.stat"))
        # The pod is deleted: the garbage collector deletes its ConfigMap, the key goes.
        kube.delete("api/v1", "configmaps", NS, "api-2-token-key")
        await until(lambda: watch.keys.ids() == {second.key_id})
        await watch.check()
    finally:
        await watch.stop()


async def test_a_deleted_configmap_is_put_back(kube: FakeKube) -> None:
    signer = CapabilitySigner.generate()
    task = asyncio.create_task(publisher(kube, signer, recheck=0.05).run())
    try:
        await until(lambda: kube.get("api/v1", "configmaps", NS, "api-1-token-key"))
        kube.delete("api/v1", "configmaps", NS, "api-1-token-key")
        await until(lambda: kube.get("api/v1", "configmaps", NS, "api-1-token-key"))
        cm = kube.get("api/v1", "configmaps", NS, "api-1-token-key")
        assert cm is not None and cm["data"]["key-id"] == signer.key_id
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watch_is_not_ready_before_its_first_list() -> None:
    kube = FakeKube()  # not started: the list cannot succeed
    watch = tokenkeys.KeyWatch(kube.kube_client(), namespace=NS, key_set=SET)
    with pytest.raises(RuntimeError):
        await watch.check()


def _cm(name: str, data: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": name}, "data": data}


def test_only_well_formed_p256_or_ed25519_keys_are_trusted() -> None:
    good = CapabilitySigner.generate()
    p256 = ec.generate_private_key(ec.SECP256R1()).public_key()
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    rsa_key = rsa.generate_private_key(65537, 2048).public_key()
    keys = tokenkeys.keys_from({
        "good": _cm("good", {"public-key.pem": good.public_key_pem().decode(),
                             "key-id": good.key_id}),
        "p256-no-kid": _cm("p256", {"public-key.pem": public_pem(p256).decode()}),
        "wrong-kid": _cm("w", {"public-key.pem": public_pem(p256).decode(),
                               "key-id": good.key_id}),
        "p384": _cm("p384", {"public-key.pem": public_pem(p384).decode()}),
        "rsa": _cm("rsa", {"public-key.pem": public_pem(rsa_key).decode()}),
        "garbage": _cm("g", {"public-key.pem": "-----BEGIN PUBLIC KEY-----\nxx\n"}),
        "empty": _cm("e", {}),
    })
    assert set(keys) == {good.key_id, key_id(p256)}
