"""Authentication: front-proxy headers, client certificates, tokens, anonymous."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tests.framework.fakekube import FakeKube
from tests.framework.frontproxy import FrontProxy
from tests.framework.until import until

from .conftest import FRONT_PROXY_CN, PROGRESS, Server, auth_configmap

SPOOF = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}


async def _status(resp: aiohttp.ClientResponse) -> dict:
    body = json.loads(await resp.text())
    assert body["kind"] == "Status" and body["code"] == resp.status
    return body


def _allow_all(kube: FakeKube) -> None:
    kube.sar_policy = lambda _spec: True


async def test_spoofed_user_without_client_cert_is_401(server: Server, kube: FakeKube) -> None:
    _allow_all(kube)
    async with server.session().get(PROGRESS, headers=SPOOF) as resp:
        assert resp.status == 401
        assert (await _status(resp))["reason"] == "Unauthorized"
    assert kube.sar_calls == []
    assert server.metric("aggapi_apiserver_authentication_failures_total",
                         reason="untrusted_identity_headers") == 1


async def test_spoofed_user_with_cert_from_other_ca_is_401(server: Server,
                                                           kube: FakeKube) -> None:
    _allow_all(kube)
    cert = server.certs.client_pair(server.certs.other_ca, FRONT_PROXY_CN, name="rogue")
    async with server.session(cert).get(PROGRESS, headers=SPOOF) as resp:
        assert resp.status == 401
        await _status(resp)
    assert kube.sar_calls == []
    assert server.metric("aggapi_apiserver_authentication_failures_total",
                         reason="unknown_authority") == 1


async def test_front_proxy_cn_not_allowed_is_401(server: Server, kube: FakeKube) -> None:
    _allow_all(kube)
    cert = server.certs.client_pair(server.certs.front_proxy_ca, "not-the-aggregator")
    async with server.session(cert).get(PROGRESS, headers=SPOOF) as resp:
        assert resp.status == 401
    assert kube.sar_calls == []


async def test_front_proxy_cert_without_user_header_is_401(server: Server,
                                                          kube: FakeKube) -> None:
    _allow_all(kube)
    cert = server.certs.client_pair(server.certs.front_proxy_ca, FRONT_PROXY_CN)
    async with server.session(cert).get(PROGRESS, headers={"X-Remote-Group": "g"}) as resp:
        assert resp.status == 401
    assert kube.sar_calls == []


async def test_client_ca_cert_cannot_carry_identity_headers(server: Server,
                                                            kube: FakeKube) -> None:
    _allow_all(kube)
    cert = server.certs.client_pair(server.certs.client_ca, "carol")
    async with server.session(cert).get(PROGRESS, headers=SPOOF) as resp:
        assert resp.status == 401


async def test_front_proxy_identity_reaches_sar(server: Server, kube: FakeKube,
                                                proxy: FrontProxy) -> None:
    _allow_all(kube)
    async with aiohttp.ClientSession() as s:
        # The proxy authenticates alice; a forged header from her is dropped by it.
        async with s.get(proxy.url + PROGRESS, headers={
                "Authorization": "Bearer alice-token", **SPOOF}) as resp:
            assert resp.status == 501  # the handler stub: authn and authz passed
            await _status(resp)
    (sar,) = kube.sar_calls
    spec = sar["spec"]
    assert spec["user"] == "alice" and spec["uid"] == "u-1"
    assert spec["groups"] == ["devs", "system:authenticated"]
    # Extra keys arrive percent-escaped and are unescaped and lowercased.
    assert spec["extra"] == {"scopes.example.com/team": ["a", "b"]}


async def test_allowed_names_empty_accepts_any_front_proxy_cn(server: Server,
                                                              kube: FakeKube) -> None:
    _allow_all(kube)
    kube.put("api/v1", "configmaps", auth_configmap(server.certs, allowed=[]))
    cert = server.certs.client_pair(server.certs.front_proxy_ca, "any-proxy-name")
    sess = server.session(cert)

    async def accepted() -> bool:
        async with sess.get(PROGRESS, headers={"X-Remote-User": "dave"}) as resp:
            return resp.status == 501
    await until(accepted)
    assert kube.sar_calls[-1]["spec"]["user"] == "dave"


async def test_client_certificate_path(server: Server, kube: FakeKube) -> None:
    _allow_all(kube)
    cert = server.certs.client_pair(server.certs.client_ca, "carol", orgs=("ops", "db"))
    async with server.session(cert).get(PROGRESS) as resp:
        assert resp.status == 501
    spec = kube.sar_calls[-1]["spec"]
    assert spec["user"] == "carol"
    assert spec["groups"] == ["ops", "db", "system:authenticated"]


async def test_token_review_path_and_cache(server: Server, kube: FakeKube) -> None:
    _allow_all(kube)
    kube.tokens["good"] = {"username": "system:serviceaccount:ns1:builder", "uid": "sa-1",
                           "groups": ["system:serviceaccounts"],
                           "extra": {"authentication.kubernetes.io/pod-name": ["p"]}}
    sess = server.session()
    for _ in range(3):
        async with sess.get(PROGRESS, headers={"Authorization": "Bearer good"}) as resp:
            assert resp.status == 501
    assert kube.token_calls == ["good"]  # cached after the first review
    spec = kube.sar_calls[-1]["spec"]
    assert spec["user"] == "system:serviceaccount:ns1:builder"
    assert spec["groups"] == ["system:serviceaccounts", "system:authenticated"]
    assert spec["extra"] == {"authentication.kubernetes.io/pod-name": ["p"]}
    async with sess.get(PROGRESS, headers={"Authorization": "Bearer bad"}) as resp:
        assert resp.status == 401
    assert server.metric("aggapi_apiserver_token_cache_total", result="hit") == 2


async def test_tokenreview_unavailable_is_401_not_anonymous(server: Server,
                                                            kube: FakeKube) -> None:
    _allow_all(kube)
    kube.tokenreview_error = 503
    async with server.session().get(PROGRESS, headers={"Authorization": "Bearer x"}) as resp:
        assert resp.status == 401
    assert kube.sar_calls == []


ANONYMOUS_REFUSED = (PROGRESS, "/apis/subresources.aggapi.io/v1alpha1", "/apis", "/metrics",
                     "/openapi/v2", "/version", "/healthz/extra", "/livez/")


async def test_anonymous_gets_401_outside_health_paths(server: Server, kube: FakeKube) -> None:
    # Even with RBAC granting system:anonymous everything, an unauthenticated request
    # to the API, discovery or metrics is refused before any SubjectAccessReview.
    _allow_all(kube)
    for path in ANONYMOUS_REFUSED:
        async with server.session().get(path) as resp:
            assert resp.status == 401, path
            assert (await resp.json())["kind"] == "Status"
    assert kube.sar_calls == []
    for path in ("/healthz", "/livez", "/readyz"):
        async with server.session().get(path) as resp:
            assert resp.status < 500 and resp.status != 401, path


async def test_anonymous_metrics_only_with_always_allow(make_server: Any,
                                                        kube: FakeKube) -> None:
    srv = await make_server(always_allow_metrics=True)
    async with srv.session().get("/metrics") as resp:
        assert resp.status == 200
    async with srv.session().get(PROGRESS) as resp:
        assert resp.status == 401


async def test_anonymous_disabled(make_server: Any, kube: FakeKube) -> None:
    srv = await make_server(anonymous_auth=False)
    async with srv.session().get(PROGRESS) as resp:
        assert resp.status == 401
    assert kube.sar_calls == []


async def test_configmap_change_takes_effect_without_restart(server: Server, kube: FakeKube,
                                                             proxy: FrontProxy) -> None:
    _allow_all(kube)
    sess = aiohttp.ClientSession()
    try:
        async def status() -> int:
            async with sess.get(proxy.url + PROGRESS,
                                headers={"Authorization": "Bearer alice-token"}) as resp:
                return resp.status
        assert await status() == 501
        # The cluster stops trusting this front proxy's name ...
        kube.put("api/v1", "configmaps", auth_configmap(server.certs, allowed=["other"]))
        await until(lambda: _is(status, 401))
        # ... and trusts it again.
        kube.put("api/v1", "configmaps", auth_configmap(server.certs))
        await until(lambda: _is(status, 501))
    finally:
        await sess.close()
    # Seen through the watch: listed once, never re-listed.
    cm = [q for m, q in kube.requests if "/configmaps" in q]
    assert len([q for q in cm if "watch=" not in q]) == 1, cm
    assert any("watch=" in q for q in cm)


async def _is(fn: Callable[[], Awaitable[int]], code: int) -> bool:
    return await fn() == code


async def test_not_ready_until_configmap_read(make_server: Any, kube: FakeKube) -> None:
    kube.delete("api/v1", "configmaps", "kube-system", "extension-apiserver-authentication")
    srv = await make_server(wait_ready=False)
    sess = srv.session()
    async with sess.get("/readyz") as resp:
        assert resp.status == 503
    async with sess.get(PROGRESS, headers={"Authorization": "Bearer x"}) as resp:
        assert resp.status == 503
        await _status(resp)
    async with sess.get("/healthz") as resp:
        assert resp.status == 200
    kube.put("api/v1", "configmaps", auth_configmap(srv.certs))

    async def ready() -> bool:
        async with sess.get("/readyz") as resp:
            return resp.status == 200
    await until(ready)
