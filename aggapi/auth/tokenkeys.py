"""Publishing the capability-token verification keys, and following them.

The default token signing (``tokenSigning.mode=ephemeral``): each apiserver replica
makes an Ed25519 key pair in memory at start (``CapabilitySigner.generate``), so no
private key is ever written to a Secret or a node's disk, and a restart rotates it.
Only the public half is published, as a ConfigMap per replica (:class:`KeyPublisher`):
named after the replica's pod, owner-referenced to it (the garbage collector deletes
it with the pod) and labelled ``aggapi.io/token-key-set=<set>``. Agents list and watch
those ConfigMaps (:class:`KeyWatch`) and verify a token with the key its ``kid`` names.

Why a ConfigMap the agents read rather than a key pushed to them over mTLS: the
apiserver's mTLS client key is still a Secret, so a pushed key would let anyone who
reads that Secret trust a key of their own and mint tokens again. Reading the
ConfigMaps needs only ``get/list/watch configmaps`` in aggapi's namespace (a Role),
and what they hold is public; to add a key one must write ConfigMaps there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from aggapi.auth.capability import CapabilitySigner, KeySet, key_id, load_verification_key
from aggapi.kube.client import KubeClient, KubeError, keep_publishing, path_segment
from aggapi.kube.informer import Informer

log = logging.getLogger(__name__)

LABEL = "aggapi.io/token-key-set"
PUBLIC_KEY = "public-key.pem"  # the ConfigMap's data key: a PEM SubjectPublicKeyInfo
KEY_ID = "key-id"  # the signer's kid, checked against the key


def configmap_name(pod_name: str) -> str:
    return f"{pod_name}-token-key"


def key_configmap(*, namespace: str, pod_name: str, pod_uid: str, key_set: str,
                  signer: CapabilitySigner) -> dict[str, Any]:
    """The ConfigMap publishing ``signer``'s public key, owned by the replica's pod."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(pod_name), "namespace": namespace,
            "labels": {LABEL: key_set},
            # Deleted by the garbage collector with the pod: a gone replica's key is
            # trusted no longer.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                 "uid": pod_uid}],
        },
        "data": {PUBLIC_KEY: signer.public_key_pem().decode(), KEY_ID: signer.key_id},
    }


def keys_from(configmaps: Mapping[str, Mapping[str, Any]]) -> dict[str, PublicKeyTypes]:
    """The valid keys among published ConfigMaps, by key id; a malformed one is skipped
    (and logged), never trusted."""
    out: dict[str, PublicKeyTypes] = {}
    for name, cm in configmaps.items():
        data = cm.get("data") or {}
        try:
            key = load_verification_key(str(data[PUBLIC_KEY]).encode())
            kid = key_id(key)
            if data.get(KEY_ID) not in (None, kid):
                raise ValueError(f"key-id {data.get(KEY_ID)!r} is not the key's ({kid})")
            KeySet({kid: key})  # only P-256 and Ed25519 keys pass
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("ignoring token key ConfigMap %s: %s", name, exc)
            continue
        out[kid] = key
    return out


class KeyPublisher:
    """Apiserver side: make sure this replica's public key is published, and stays so.

    ``published`` is set once the ConfigMap holds this process's key (the apiserver is
    not ready before); it is checked again every ``recheck`` seconds, so a deleted or
    overwritten ConfigMap is put back."""

    def __init__(self, api: KubeClient, signer: CapabilitySigner, *, namespace: str,
                 pod_name: str, pod_uid: str, key_set: str, recheck: float = 30.0) -> None:
        if not (namespace and pod_name and pod_uid and key_set):
            raise ValueError("publishing the token key needs the pod's namespace, name "
                             "and uid, and the key set's name")
        self._api = api
        self.object = key_configmap(namespace=namespace, pod_name=pod_name,
                                    pod_uid=pod_uid, key_set=key_set, signer=signer)
        self._collection = f"/api/v1/namespaces/{path_segment(namespace)}/configmaps"
        self._path = f"{self._collection}/{path_segment(configmap_name(pod_name))}"
        self._recheck = recheck
        self.published = asyncio.Event()

    async def publish_once(self) -> None:
        """Create the ConfigMap, or replace what a previous run of this pod left."""
        try:
            current = await self._api.get(self._path)
        except KubeError as exc:
            if exc.status != 404:
                raise
            await self._api.post(self._collection, self.object)
        else:
            if current.get("data") == self.object["data"] and \
                    (current.get("metadata") or {}).get("labels") == \
                    self.object["metadata"]["labels"]:
                self.published.set()
                return
            body = dict(self.object)
            body["metadata"] = {**self.object["metadata"], "resourceVersion":
                                (current.get("metadata") or {}).get("resourceVersion", "")}
            await self._api.request("PUT", self._path, body=body)
        self.published.set()
        log.info("published the capability token key",
                 extra={"configmap": self._path, "keyId": self.object["data"][KEY_ID]})

    async def run(self) -> None:
        await keep_publishing(self.publish_once, self._recheck,
                              "the capability token key", log)


class KeyWatch:
    """Agent side: the published keys of one key set, as a :class:`KeySet`."""

    def __init__(self, api: KubeClient, *, namespace: str, key_set: str) -> None:
        self.keys = KeySet()
        self._informer = Informer(
            api, f"/api/v1/namespaces/{path_segment(namespace)}/configmaps",
            {"labelSelector": f"{LABEL}={key_set}"})
        self._informer.add_listener(lambda _kind, _obj: self._rebuild())

    def _rebuild(self) -> None:
        self.keys.replace(keys_from(self._informer.items))

    def start(self) -> None:
        self._informer.start()

    async def stop(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._informer.stop()

    async def check(self) -> None:
        """For /readyz: raises until the keys have been listed at least once. No key
        at all is not a failure: the apiservers may be restarting, and an unready
        agent would only drop out of their EndpointSlices."""
        if not self.keys.loaded:
            raise RuntimeError("token verification keys not listed yet")
