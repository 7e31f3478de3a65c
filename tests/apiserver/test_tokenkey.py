"""The apiserver's default token signing: a key made in memory, its public half
published as a ConfigMap owned by this replica's pod; not ready before that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggapi.auth.capability import CapabilityVerifier, key_id, load_verification_key
from aggapi.auth.tokenkeys import LABEL
from aggapi.tls import certs as aggapi_certs
from tests.framework.fakekube import FakeKube
from tests.framework.until import until


def _agent_files(tmp_path: Path) -> dict[str, str]:
    aggapi_certs.generate(tmp_path)
    return {"agent_ca_file": str(tmp_path / "ca.crt"),
            "agent_client_cert_file": str(tmp_path / "agent-client.crt"),
            "agent_client_key_file": str(tmp_path / "agent-client.key")}


POD = {"token_key_set": "aggapi", "pod_namespace": "aggapi", "pod_name": "aggapi-7f-x",
       "pod_uid": "0f0e"}


async def test_key_made_in_memory_and_only_its_public_half_published(
        make_server: Any, kube: FakeKube, tmp_path: Path) -> None:
    kube.writable = {"configmaps"}
    srv = await make_server(**_agent_files(tmp_path), **POD)
    sess = srv.session()

    async def ready() -> bool:
        async with sess.get("/readyz?verbose") as resp:
            return "[+]token-key ok" in await resp.text()

    await until(ready)
    cm = kube.get("api/v1", "configmaps", "aggapi", "aggapi-7f-x-token-key")
    assert cm is not None and cm["metadata"]["labels"] == {LABEL: "aggapi"}
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "0f0e"
    agent = srv.parts.agent
    assert agent is not None
    signer = agent._signer
    public = load_verification_key(cm["data"]["public-key.pem"].encode())
    assert key_id(public) == signer.key_id
    token = signer.sign(node="n1", subject="a", operation="copy.stat")
    assert CapabilityVerifier(cm["data"]["public-key.pem"].encode(), "n1").verify(token)
    # Nothing private anywhere in the fake cluster's objects.
    assert "PRIVATE KEY" not in repr(kube.objects)


async def test_not_ready_until_published(make_server: Any, kube: FakeKube,
                                         tmp_path: Path) -> None:
    # ConfigMaps not writable: the key cannot be published, the replica stays unready.
    srv = await make_server(**_agent_files(tmp_path), **POD)
    async with srv.session().get("/readyz?verbose") as resp:
        assert resp.status == 503
        assert "[-]token-key failed" in await resp.text()


@pytest.mark.parametrize("missing", ["token_key_set", "pod_namespace", "pod_name", "pod_uid"])
async def test_in_memory_key_needs_the_pod_identity(make_server: Any, tmp_path: Path,
                                                    missing: str) -> None:
    with pytest.raises(SystemExit):
        await make_server(**_agent_files(tmp_path), **{**POD, missing: ""})
