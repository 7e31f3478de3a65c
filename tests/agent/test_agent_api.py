"""The agent's HTTPS API: who may call it, and what the progress routes answer.
Real TLS on 127.0.0.1; containerd and CRI are in-memory fakes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggapi.auth.capability import CapabilitySigner
from aggapi.runtime.cri import Sandbox
from aggapi.tls import pki as aggapi_pki
from tests.agent.agentserver import NODE, Agent, client_ssl, pki, run_agent
from tests.agent.fakectd import FakeContainerd, make_image

REF = "127.0.0.1:5000/app:1"


class FakeCRI:
    def __init__(self, sandboxes: list[Sandbox]) -> None:
        self.sandboxes = sandboxes

    async def list_pod_sandboxes(self, labels: Mapping[str, str] | None = None
                                 ) -> list[Sandbox]:
        want = dict(labels or {})
        return [s for s in self.sandboxes if all(s.labels.get(k) == v for k, v in want.items())]


def sandbox(ns: str, name: str, uid: str) -> Sandbox:
    return Sandbox("sb1", name, ns, uid, "SANDBOX_READY",
                   {"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
                    "io.kubernetes.pod.namespace": ns}, {}, "")


@pytest.fixture
def fake() -> FakeContainerd:
    fake = FakeContainerd()
    fake.now = time.time()
    return fake


@pytest.fixture
async def agent(tmp_path: Path, fake: FakeContainerd) -> AsyncIterator[Agent]:
    kcfg = tmp_path / "kubelet.json"
    kcfg.write_text(json.dumps({"kind": "KubeletConfiguration", "serializeImagePulls": True}))
    cri = FakeCRI([sandbox("default", "p", "uid-1"), sandbox("default", "q", "uid-3")])
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=fake,
                         poll_interval=0.02, kubelet_config=str(kcfg)) as a:
        yield a


async def status(agent: Agent, token: str | None, path: str = "/v1/imagepullprogress",
                 **params: str) -> tuple[int, Any]:
    async with agent.get(path, token, params=params) as resp:
        body = await resp.text()
        return resp.status, body


async def test_present_image_answers_once_with_summary(agent: Agent, fake: FakeContainerd
                                                       ) -> None:
    img = make_image(REF, [100], "app")
    fake.start_pull(img, "L0")
    fake.fetch_manifest(img, "L0")
    fake.finish(img, "L0")
    code, body = await status(agent, agent.token(images=[REF]), follow="false")
    assert code == 200, body
    lines = [json.loads(x) for x in body.splitlines()]
    assert lines[0]["phase"] == "AlreadyPresent" and lines[0]["layer"] == img.layers[0][0]
    assert lines[-1]["kind"] == "Summary" and lines[-1]["phase"] == "AlreadyPresent"


async def test_follow_streams_a_pull_until_done(agent: Agent, fake: FakeContainerd) -> None:
    img = make_image(REF, [1000], "app")
    (digest, size) = img.layers[0]

    async def pull() -> None:
        fake.start_pull(img, "L1")
        fake.fetch_manifest(img, "L1")
        for off in (100, 500, 1000):
            await asyncio.sleep(0.1)
            fake.now += 0.1
            fake.download(digest, off, size, "L1")
        await asyncio.sleep(0.1)
        fake.commit(digest, size, "L1")
        fake.extract(img.chains[0], active=False)
        fake.finish(img, "L1")

    objs = []
    task = None
    async for obj in agent.stream(agent.token(images=[REF]), granularity="pod"):
        objs.append(obj)
        task = task or asyncio.create_task(pull())
    assert objs[0]["phase"] == "Waiting" and objs[0]["image"] == ""
    assert [o["progress"] for o in objs if o["phase"] == "Downloading"][-1] == 1000
    assert objs[-2]["phase"] == "Done" and objs[-1]["kind"] == "Summary"


async def test_node_view_has_kubelet_limits(agent: Agent, fake: FakeContainerd) -> None:
    img = make_image(REF, [10], "present")
    fake.finish(img, "no-lease")
    bare = "sha256:" + "0" * 64  # CRI's record of the image id
    fake.images[bare] = dataclasses.replace(fake.images[REF], name=bare)
    code, body = await status(agent, agent.token("imagepulls"), "/v1/imagepulls")
    assert code == 200, body
    doc = json.loads(body)
    assert doc["kubelet"]["serializeImagePulls"] is True
    assert doc["kubelet"]["parallelSlots"] == 1
    assert doc["slots"] == {"limit": 1, "serialize": True, "error": "",
                            "source": doc["kubelet"]["source"]}
    assert doc["inFlight"] == 0 and doc["slotsFree"] == 1 and doc["node"] == NODE
    # the images on the node, by name (not CRI's bare sha256:<id> records)
    assert doc["presentImages"] == [REF]


async def test_node_view_has_no_link_ticks_while_nothing_downloads(agent: Agent) -> None:
    """The ticks of containerd's received bytes (the leader's link judgement) are read
    only while layers download: none here, and the member says so."""
    code, body = await status(agent, agent.token("imagepulls"), "/v1/imagepulls")
    assert code == 200, body
    assert json.loads(body)["linkTicks"] == []


async def test_node_view_with_an_unreadable_kubelet_config(tmp_path: Path,
                                                           fake: FakeContainerd) -> None:
    """The limit is not known, and says why: never one slot as fact."""
    async with run_agent(pki(tmp_path / "pki"), cri=FakeCRI([]), containerd=fake,
                         kubelet_config=str(tmp_path / "missing.yaml")) as agent:
        code, body = await status(agent, agent.token("imagepulls"), "/v1/imagepulls")
    assert code == 200, body
    doc = json.loads(body)
    assert doc["slots"]["limit"] is None and doc["slots"]["serialize"] is None
    assert "FileNotFoundError" in doc["slots"]["error"]
    assert doc["kubelet"]["parallelSlots"] is None and doc["slotsFree"] is None


@pytest.mark.parametrize("case", ["none", "expired", "other-node", "wrong-op", "other-pod",
                                  "other-container", "garbage"])
async def test_bad_tokens_are_refused(agent: Agent, case: str) -> None:
    want = 401
    token: str | None
    if case == "none":
        token = None
    elif case == "expired":
        old = CapabilitySigner((agent.pki / "token-signing.key").read_bytes(), ttl=10,
                               clock=lambda: time.time() - 60)
        token = old.sign(node=NODE, subject="a", operation="imagepullprogress")
    elif case == "other-node":
        token, want = agent.token(images=[REF], node="node-b"), 403
    elif case == "wrong-op":
        token, want = agent.token("copy.stat", images=[REF]), 403
    elif case == "other-pod":  # uid-3 is pod q on this node, the token says p
        token, want = agent.token(images=[REF], uid="uid-3"), 403
    elif case == "other-container":
        code, _ = await status(agent, agent.token(images=[REF]), container="nope")
        assert code == 403
        return
    else:
        token = "not.a.jwt"
    code, body = await status(agent, token)
    assert code == want, body
    assert json.loads(body)["kind"] == "Status"


async def test_a_pod_created_again_under_its_name_is_accepted(agent: Agent) -> None:
    """default/p was deleted and created again (uid-2) while the old sandbox (uid-1)
    is still on the node: the new pod's token is good."""
    code, body = await status(agent, agent.token(images=[REF], uid="uid-2"), follow="false")
    assert code == 200, body


async def test_replayed_token_is_refused(agent: Agent) -> None:
    token = agent.token("imagepulls")
    assert (await status(agent, token, "/v1/imagepulls"))[0] == 200
    assert (await status(agent, token, "/v1/imagepulls"))[0] == 401


async def test_tls_without_client_cert_or_from_another_ca_fails(agent: Agent,
                                                                tmp_path: Path) -> None:
    other = pki(tmp_path / "other")
    contexts: list[ssl.SSLContext] = [
        client_ssl(agent.pki, cert=False),
        client_ssl(other, trust=agent.pki),  # cert from a CA the agent does not trust
    ]
    for ctx in contexts:
        with pytest.raises(aiohttp.ClientError):
            async with agent.get("/healthz", None, ssl_ctx=ctx) as resp:
                await resp.read()
    async with agent.get("/healthz", None) as resp:  # the apiserver's cert: fine
        assert resp.status == 200


async def test_wrong_client_cn_is_403(tmp_path: Path, agent: Agent) -> None:
    ca = aggapi_pki.load_pair(agent.pki / "ca.crt", agent.pki / "ca.key")
    aggapi_pki.issue(ca, "someone-else", client=True).write(tmp_path / "c.crt",
                                                            tmp_path / "c.key")
    ctx = ssl.create_default_context(cafile=str(agent.pki / "ca.crt"))
    ctx.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    async with agent.get("/v1/imagepulls", agent.token("imagepulls"), ssl_ctx=ctx) as resp:
        assert resp.status == 403
