"""Per-node agent identities: a certificate counts for pod P on node N only from a CSR
kube-apiserver says P's own token made on N, signed by the certificate's key; and the
apiserver then trusts that certificate alone for P, so one node's agent key cannot
answer for another node's agent."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentEndpoint
from aggapi.auth import agentidentity as ai
from aggapi.auth.capability import CapabilitySigner
from aggapi.status import StatusError
from aggapi.tls import certs as aggapi_certs
from tests.framework.fakekube import FakeKube

SA = "system:serviceaccount:aggapi:aggapi-agent"
ID_A, ID_B = ai.new_identity("n1"), ai.new_identity("n2")


def made_by_agent(identity: ai.Identity, node: str, uid: str,
                  created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    """The CSR as kube-apiserver stores it after the agent pod's token created it."""
    csr = ai.csr_object(identity, node, "aggapi")
    csr["metadata"] = {"name": f"csr-{uid}-{created[-9:-1]}", "labels":
                       csr["metadata"]["labels"], "creationTimestamp": created}
    csr["spec"].update(username=SA, groups=["system:serviceaccounts"],
                       extra={ai.POD_UID: [uid], ai.NODE_NAME: [node]})
    return csr


def test_an_agents_csr_pins_its_certificate_to_its_pod() -> None:
    got = ai.pin_of(made_by_agent(ID_A, "n1", "uid-a"), username=SA)
    assert not isinstance(got, str), got
    uid, pin = got
    assert (uid, pin.node, pin.cert_pem) == ("uid-a", "n1", ID_A.cert_pem)


def _other_key_request(csr: dict[str, Any]) -> None:
    # B's certificate inside a request signed by A's key: no proof of B's key.
    forged = ai.csr_object(ai.Identity(ID_A.key, ID_B.cert), "n1", "aggapi")
    csr["spec"]["request"] = forged["spec"]["request"]


FORGERIES: dict[str, Any] = {
    "made by a user, not the agent's SA": lambda c: c["spec"].update(username="mallory"),
    "made without a pod-bound token": lambda c: c["spec"].update(extra={}),
    "two pod uids": lambda c: c["spec"]["extra"].update({ai.POD_UID: ["a", "b"]}),
    "no node name": lambda c: c["spec"]["extra"].pop(ai.NODE_NAME, None),
    "another signer": lambda c: c["spec"].update(signerName="kubernetes.io/kubelet-serving"),
    "certificate of another key": _other_key_request,
    "garbage request": lambda c: c["spec"].update(request=base64.b64encode(b"x").decode()),
}


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(sorted(FORGERIES)), min_size=1))
def test_no_forged_csr_pins_anything(forgeries: set[str]) -> None:
    csr = made_by_agent(ID_A, "n1", "uid-a")
    for f in sorted(forgeries):
        FORGERIES[f](csr)
    assert isinstance(ai.pin_of(csr, username=SA), str)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    k = FakeKube()
    k.writable = {"certificatesigningrequests"}
    await k.start()
    yield k
    await k.stop()


async def test_the_agent_publishes_a_csr_of_its_key(kube: FakeKube) -> None:
    api = kube.kube_client()
    try:
        pub = ai.IdentityPublisher(api, ID_A, node="n1", key_set="aggapi")
        with pytest.raises(RuntimeError):
            await pub.check()
        task = asyncio.create_task(pub.run())
        await asyncio.wait_for(pub.published.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.check()
        (csr,) = kube.objects[("apis/certificates.k8s.io/v1", "certificatesigningrequests")
                              ].values()
        assert csr["metadata"]["name"].startswith("aggapi-agent-n1-")
        assert "PRIVATE" not in repr(csr)
        # What kube-apiserver adds (the requester) makes it a pin of ID_A's certificate.
        stored = copy.deepcopy(csr)
        stored["spec"].update(username=SA, extra={ai.POD_UID: ["u"], ai.NODE_NAME: ["n1"]})
        got = ai.pin_of(stored, username=SA)
        assert not isinstance(got, str) and got[1].cert_pem == ID_A.cert_pem
    finally:
        await api.close()


class _Dir:
    def __init__(self, ep: AgentEndpoint) -> None:
        self.ep = ep

    async def endpoint(self, node: str) -> AgentEndpoint:
        return self.ep


async def _agent(identity: ai.Identity, pki: Path) -> tuple[web.AppRunner, int]:
    app = web.Application()

    async def ok(_r: web.Request) -> web.Response:
        return web.Response(text="agent")

    app.router.add_get("/v1/imagepulls", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0,
                       ssl_context=identity.server_context(str(pki / "ca.crt")))
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def test_another_nodes_agent_key_cannot_answer_for_a_node(kube: FakeKube,
                                                                tmp_path: Path) -> None:
    aggapi_certs.generate(tmp_path)
    kube.put("apis/certificates.k8s.io/v1", "certificatesigningrequests",
             made_by_agent(ID_A, "n1", "uid-a"))
    kube.put("apis/certificates.k8s.io/v1", "certificatesigningrequests",
             made_by_agent(ID_B, "n2", "uid-b"))
    api = kube.kube_client()
    pins = ai.IdentityPins(api, key_set="aggapi", namespace="aggapi",
                           service_account="aggapi-agent",
                           client_cert=str(tmp_path / "agent-client.crt"),
                           client_key=str(tmp_path / "agent-client.key"))
    pins.start()
    runners = []
    try:
        while not (pins.pin("uid-a", "n1") and pins.pin("uid-b", "n2")):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        assert pins.pin("uid-a", "n2") is None  # pinned to its own node only
        for ident in (ID_A, ID_B):
            runners.append(await _agent(ident, tmp_path))
        (_, port_a), (_, port_b) = runners

        async def call(port: int) -> str:
            ep = AgentEndpoint("n1", "127.0.0.1", port, pod="agent-a", pod_uid="uid-a")
            client = AgentClient(_Dir(ep), CapabilitySigner.generate(),  # type: ignore[arg-type]
                                 ca_file=str(tmp_path / "ca.crt"),
                                 cert_file=str(tmp_path / "agent-client.crt"),
                                 key_file=str(tmp_path / "agent-client.key"), pins=pins)
            try:
                resp = await client.open("GET", "/v1/imagepulls", node="n1", subject="a",
                                         operation="imagepulls")
                text = await resp.text()
                resp.release()
                return text
            finally:
                await client.close()

        assert await call(port_a) == "agent"
        # n2's agent (its own key, validly published for n2) at n1's entry: refused in
        # the handshake, before any capability token is sent.
        with pytest.raises(StatusError) as err:
            await call(port_b)
        assert err.value.code == 503 and "CERTIFICATE_VERIFY_FAILED" in str(err.value)
    finally:
        for r, _ in runners:
            await r.cleanup()
        await pins.stop()
        await api.close()



CSR_API = ("apis/certificates.k8s.io/v1", "certificatesigningrequests")


async def test_one_csr_event_parses_that_csr_alone(kube: FakeKube, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5,000 agents, reparsing every CSR on each event stalled the loop for seconds."""
    for i in range(20):
        kube.put(*CSR_API, made_by_agent(ID_A, f"n{i}", f"uid-{i}"))
    parsed: list[str] = []
    real = ai.pin_of

    def counting(csr: Any, *, username: str) -> Any:
        parsed.append(str(csr["metadata"]["name"]))
        return real(csr, username=username)
    monkeypatch.setattr(ai, "pin_of", counting)
    api = kube.kube_client()
    pins = ai.IdentityPins(api, key_set="aggapi", namespace="aggapi",
                           service_account="aggapi-agent", client_cert="", client_key="")
    pins.start()
    try:
        while pins.pin("uid-19", "n19") is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        assert len(parsed) == 20
        parsed.clear()
        kube.put(*CSR_API, made_by_agent(ID_B, "n20", "uid-20"))
        while pins.pin("uid-20", "n20") is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        assert len(parsed) == 1, parsed
        # Deleted: its pin goes, parsing nothing; the others stay.
        name = made_by_agent(ID_B, "n20", "uid-20")["metadata"]["name"]
        kube.delete(*CSR_API, "", name)
        while pins.pin("uid-20", "n20") is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        assert len(parsed) == 1 and pins.pin("uid-3", "n3") is not None
    finally:
        await pins.stop()
        await api.close()


_OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "delete", "relist"]),
                          st.integers(0, 5), st.integers(0, 2), st.integers(0, 3)),
                max_size=25)
_VALID = {i: made_by_agent(ID_A if i % 2 else ID_B, f"n{i % 3}", f"uid-{i % 3}",
                           f"2026-01-0{1 + i % 4}T00:00:00Z") for i in range(6)}


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_pins_kept_per_event_equal_pins_rebuilt_from_every_csr(
        ops: list[tuple[str, int, int, int]]) -> None:
    """Whatever the order of adds, changes (a CSR's node, creation time or validity)
    and deletions, the index holds the newest valid pin of each pod: what a rebuild
    from all the CSRs gives."""
    index = ai.PinIndex(SA)
    store: dict[str, dict[str, Any]] = {}
    rv = 0
    for op, i, node, day in ops:
        name = f"csr-{i}"
        if op == "put":
            rv += 1
            csr = copy.deepcopy(_VALID[i])
            csr["metadata"].update(name=name, resourceVersion=str(rv),
                                   creationTimestamp=f"2026-01-0{1 + day}T00:00:00Z")
            csr["spec"]["extra"][ai.NODE_NAME] = [f"n{node}"]
            if day == 3:
                csr["spec"]["username"] = "mallory"  # proves nothing
            kind = "MODIFIED" if name in store else "ADDED"
            store[name] = csr
            index.apply(kind, csr)
        elif op == "delete" and name in store:
            index.apply("DELETED", store.pop(name))
        elif op == "relist":
            index.relist(store.values())
    newest: dict[str, tuple[str, str, ai.Pin]] = {}  # uid -> (created, name, pin)
    for name, csr in store.items():
        got = ai.pin_of(csr, username=SA)
        if not isinstance(got, str) and (got[1].created, name) > newest.get(
                got[0], ("", "", None))[:2]:
            newest[got[0]] = (got[1].created, name, got[1])
    assert index.pins == {uid: pin for uid, (_, _, pin) in newest.items()}
