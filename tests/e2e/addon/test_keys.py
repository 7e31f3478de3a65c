"""Token keys on the installed add-on (issue 24, finding 3): no private key at rest, and a
restarted apiserver replica's new key works at once.

By default (tokenSigning.mode=ephemeral) no Secret in aggapi's namespace holds a token
signing key: each replica publishes only the public key of a key it made in memory, as a
ConfigMap owned by its pod. Deleting a replica's pod garbage-collects its ConfigMap; the
new pod publishes a new key, and copies (in and out) and progress on both nodes keep
working through whichever replica the aggregator picks.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from aggapi.capability import key_id, load_verification_key
from aggapi.tokenkeys import LABEL
from tests.e2e.addon.helpers import (
    MiB,
    delete_pods,
    download,
    exec_in,
    path,
    run_pod,
    sha256,
    until,
)
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster

pytestmark = pytest.mark.e2e


def _key_configmaps(a: Addon) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = a.get_json("configmaps", "-n", a.namespace,
                                             f"-l={LABEL}")["items"]
    return items


def _published(a: Addon) -> dict[str, str]:
    """Owner pod uid -> key id of each published key (checked against its key)."""
    out = {}
    for cm in _key_configmaps(a):
        data = cm["data"]
        assert "PRIVATE" not in json.dumps(data)
        kid = key_id(load_verification_key(data["public-key.pem"].encode()))
        assert kid == data["key-id"]
        (owner,) = cm["metadata"]["ownerReferences"]
        assert owner["kind"] == "Pod"
        out[owner["uid"]] = kid
    return out


def _serving_uids(a: Addon) -> set[str]:
    return {p["metadata"]["uid"] for p in a.apiserver_pods() if a.ready(p)}


def test_no_signing_key_at_rest_and_a_restarted_replica_signs_at_once(
        installed_addon: Addon, two_node_cluster: Cluster, tmp_path: Path) -> None:
    a, cp = installed_addon, installed_addon.cp
    # 1. No Secret holds token material: only the three TLS Secrets have a private key.
    secrets = a.get_json("secrets", "-n", a.namespace)["items"]
    with_keys = {s["metadata"]["name"] for s in secrets
                 if any(b"PRIVATE KEY" in base64.b64decode(v)
                        for v in (s.get("data") or {}).values())}
    assert with_keys == {f"{a.fullname}-apiserver-tls", f"{a.fullname}-agent-tls",
                         f"{a.fullname}-agent-client-tls"}, with_keys
    # One published public key per running replica, each owned by its pod.
    before = _published(a)
    assert set(before) == _serving_uids(a), (before, _serving_uids(a))
    assert len(set(before.values())) == len(before)

    names = [f"addon-keys-{n.k}" for n in two_node_cluster.nodes]
    for n, name in zip(two_node_cluster.nodes, names, strict=True):
        run_pod(cp, name, n.name, wait=False)
    for name in names:
        cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
    try:
        # 2. Restart one replica: its pod goes (and its key with it), a new one comes.
        victim = a.apiserver_pods()[0]["metadata"]
        t0 = time.monotonic()
        a.kubectl("-n", a.namespace, "delete", "pod", victim["name"], "--wait=false")
        until(lambda: victim["uid"] not in _published(a), 60,
              "the deleted replica's key ConfigMap to be garbage-collected")
        gone = time.monotonic() - t0
        want = a.get_json("deployment", "-n", a.namespace, a.fullname)["spec"]["replicas"]

        def rotated() -> bool:
            uids = _serving_uids(a)
            return len(uids) == want and set(_published(a)) == uids
        until(rotated, 180, "a new replica Ready with its own published key")
        after = _published(a)
        assert not set(after.values()) & {before[victim["uid"]]}
        print(f"\nkeys: replica {victim['name']} deleted; its key gone after {gone:.1f}s, "
              f"{len(after)} replicas serving with published keys after "
              f"{time.monotonic() - t0:.1f}s")
        # 3. Copies and progress on both nodes, several times so both replicas answer.
        rounds = 3
        for i in range(rounds):
            for n, name in zip(two_node_cluster.nodes, names, strict=True):
                data = os.urandom(1 * MiB + i)
                src = tmp_path / f"up-{n.k}-{i}"
                src.write_bytes(data)
                r = cp.kubectl("create", "--raw",
                               path("copy", name, container="c", path=f"/tmp/k{i}"),
                               "-f", str(src))
                assert json.loads(r.stdout)["sha256"] == sha256(data)
                assert exec_in(cp, name, "sha256sum", f"/tmp/k{i}").split()[0] == sha256(data)
                got = download(cp, path("copy", name, container="c", path=f"/tmp/k{i}"),
                               tmp_path / f"down-{n.k}-{i}")
                assert got == sha256(data)
                code, body = cp.get(path("imagepullprogress", name), timeout=30)
                assert code == 200, body
                objs = [json.loads(line) for line in body.splitlines() if line.strip()]
                assert objs and not [o for o in objs if o.get("kind") == "Error"], objs
        print(f"keys: {rounds} rounds of upload + download + progress on "
              f"{len(names)} nodes after the rotation, all answered")
    finally:
        delete_pods(cp, *names)
