"""Authorization: SubjectAccessReview attributes, caching, failing closed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from aggapi.apiserver.requestinfo import RequestInfo, parse
from aggapi.apiserver.routes import copy_authz
from aggapi.apiserver.user import UserInfo
from tests.framework.fakekube import FakeKube
from tests.framework.frontproxy import FrontProxy

from .conftest import GV, PROGRESS, WATCH_PROGRESS, Server

ALICE = {"Authorization": "Bearer alice-token"}


async def _get(proxy: FrontProxy, path: str, method: str = "GET",
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None]:
    async with aiohttp.ClientSession() as s, s.request(
            method, proxy.url + path, headers=headers or ALICE) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if text.startswith("{") else None)


async def test_denied_is_403_status(server: Server, kube: FakeKube, proxy: FrontProxy) -> None:
    kube.sar_policy = lambda _spec: (False, "RBAC: no rule")
    code, body = await _get(proxy, PROGRESS)
    assert code == 403
    assert body is not None and body["kind"] == "Status" and body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods/imagepullprogress "web-0" is forbidden: User "alice" cannot get resource '
        '"pods/imagepullprogress" in API group "subresources.aggapi.io" in the namespace '
        '"ns1": RBAC: no rule')


async def test_sar_attributes(server: Server, kube: FakeKube, proxy: FrontProxy) -> None:
    kube.sar_policy = lambda _spec: True
    for path, method in ((PROGRESS, "GET"), (PROGRESS, "HEAD"),
                         (GV + "/namespaces/ns1/pods/web-0/copy", "POST"),
                         (GV + "/namespaces/ns1/pods/web-0/copy", "HEAD"),
                         (GV + "/nodes/node-a/imagepulls", "GET")):
        code, _ = await _get(proxy, path, method)
        assert code == 501
    attrs = [c["spec"]["resourceAttributes"] for c in kube.sar_calls]
    assert attrs[0] == {"namespace": "ns1", "verb": "get", "group": "subresources.aggapi.io",
                        "version": "v1alpha1", "resource": "pods",
                        "subresource": "imagepullprogress", "name": "web-0"}
    assert len(attrs) == 5  # HEAD is verb get: the first one was served from the cache
    assert (attrs[1]["verb"], attrs[1]["subresource"]) == ("create", "copy")
    # An upload also needs create on core pods/exec, decided before the handler runs.
    assert (attrs[2]["verb"], attrs[2]["group"], attrs[2]["subresource"]) == (
        "create", "", "exec")
    assert (attrs[3]["verb"], attrs[3]["subresource"]) == ("get", "copy")
    assert attrs[4] == {"namespace": "", "verb": "get", "group": "subresources.aggapi.io",
                        "version": "v1alpha1", "resource": "nodes",
                        "subresource": "imagepulls", "name": "node-a"}


async def test_watch_prefix_is_verb_watch(server: Server, kube: FakeKube,
                                          proxy: FrontProxy) -> None:
    kube.sar_policy = lambda spec: spec["resourceAttributes"]["verb"] == "watch"
    assert (await _get(proxy, WATCH_PROGRESS))[0] == 501
    assert (await _get(proxy, PROGRESS))[0] == 403
    verbs = [c["spec"]["resourceAttributes"]["verb"] for c in kube.sar_calls]
    assert verbs == ["watch", "get"]
    # copy under the prefix: any method is watch; the operation's own verb (create)
    # is then checked too, and refused here.
    before = len(kube.sar_calls)
    assert (await _get(proxy, GV + "/watch/namespaces/ns1/pods/web-0/copy", "POST"))[0] == 403
    assert [c["spec"]["resourceAttributes"]["verb"] for c in kube.sar_calls[before:]] == [
        "watch", "create"]


async def test_decisions_cached(server: Server, kube: FakeKube, proxy: FrontProxy) -> None:
    kube.sar_policy = lambda spec: spec["resourceAttributes"]["name"] == "web-0"
    for _ in range(5):
        assert (await _get(proxy, PROGRESS))[0] == 501
    other = PROGRESS.replace("web-0", "db-0")
    for _ in range(3):
        assert (await _get(proxy, other))[0] == 403
    assert len(kube.sar_calls) == 2
    assert server.metric("aggapi_apiserver_authorization_cache_total", result="hit") == 6
    assert server.metric("aggapi_apiserver_authorization_cache_total", result="miss") == 2
    assert server.metric("aggapi_apiserver_subjectaccessreviews_total", result="denied") == 1


async def test_cache_expires(make_server: Any, kube: FakeKube) -> None:
    srv = await make_server(authz_allow_ttl=0.2)
    kube.sar_policy = lambda _spec: True
    cert = srv.certs.client_pair(srv.certs.client_ca, "carol")
    sess = srv.session(cert)
    for delay in (0, 0, 0.3):
        await asyncio.sleep(delay)
        async with sess.get(PROGRESS) as resp:
            assert resp.status == 501
    assert len(kube.sar_calls) == 2


async def test_concurrent_identical_requests_share_one_review(server: Server, kube: FakeKube,
                                                              proxy: FrontProxy) -> None:
    async def slow(_spec: dict[str, Any]) -> bool:
        await asyncio.sleep(0.2)
        return True
    kube.sar_policy = slow
    codes = await asyncio.gather(*(_get(proxy, PROGRESS) for _ in range(20)))
    assert {c for c, _ in codes} == {501}
    assert len(kube.sar_calls) == 1


async def test_sar_error_fails_closed(server: Server, kube: FakeKube,
                                      proxy: FrontProxy) -> None:
    kube.sar_policy = lambda _spec: True
    kube.sar_error = 500
    code, body = await _get(proxy, PROGRESS)
    assert code == 503 and body is not None and body["kind"] == "Status"
    # Errors are not cached: the next request asks again and can succeed.
    kube.sar_error = None
    assert (await _get(proxy, PROGRESS))[0] == 501


async def test_sar_service_down_fails_closed(server: Server, kube: FakeKube,
                                             proxy: FrontProxy) -> None:
    kube.sar_policy = lambda _spec: True
    await kube.stop()
    code, body = await _get(proxy, PROGRESS)
    assert code == 503 and body is not None and body["reason"] == "ServiceUnavailable"
    assert server.metric("aggapi_apiserver_subjectaccessreviews_total", result="error") == 1


async def test_sar_evaluation_error_is_no_allow(server: Server, kube: FakeKube,
                                                proxy: FrontProxy) -> None:
    kube.sar_policy = lambda _spec: {"allowed": False, "evaluationError": "webhook timeout"}
    assert (await _get(proxy, PROGRESS))[0] == 403


async def test_discovery_and_openapi_need_no_sar(server: Server, kube: FakeKube,
                                                 proxy: FrontProxy) -> None:
    agg = {"Authorization": "Bearer aggregator-token"}
    for path in (GV, "/apis", "/apis/subresources.aggapi.io", "/openapi/v2", "/openapi/v3",
                 "/openapi/v3/apis/subresources.aggapi.io/v1alpha1"):
        async with aiohttp.ClientSession() as s, s.get(proxy.url + path, headers=agg) as resp:
            assert resp.status == 200, path
    assert kube.sar_calls == []


async def test_metrics_is_a_non_resource_check(server: Server, kube: FakeKube) -> None:
    kube.sar_policy = lambda spec: spec.get("nonResourceAttributes") == {
        "path": "/metrics", "verb": "get"}
    kube.tokens["prom"] = {"username": "prometheus"}
    sess = server.session()
    async with sess.get("/metrics", headers={"Authorization": "Bearer prom"}) as resp:
        assert resp.status == 200
        assert "aggapi_apiserver_requests_total" in await resp.text()
    kube.sar_policy = lambda _spec: False
    kube.tokens["other"] = {"username": "someone"}
    async with sess.get("/metrics", headers={"Authorization": "Bearer other"}) as resp:
        assert resp.status == 403
    async with sess.get("/metrics") as resp:  # anonymous: health paths only
        assert resp.status == 401


async def test_metrics_always_allowed_flag(make_server: Any, kube: FakeKube) -> None:
    srv = await make_server(always_allow_metrics=True)
    async with srv.session().get("/metrics") as resp:
        assert resp.status == 200
    assert kube.sar_calls == []


async def test_handlers_can_make_extra_checks(server: Server, kube: FakeKube) -> None:
    kube.sar_policy = lambda spec: spec["resourceAttributes"]["subresource"] == "exec"
    authorizer = server.parts.authorizer
    user = UserInfo("alice", groups=("system:authenticated",))
    exec_attrs = RequestInfo(verb="create", api_version="v1", namespace="ns1", resource="pods",
                             subresource="exec", name="web-0", is_resource_request=True)
    assert (await authorizer.authorize(user, exec_attrs)).allowed
    log_attrs = RequestInfo(verb="get", api_version="v1", namespace="ns1", resource="pods",
                            subresource="log", name="web-0", is_resource_request=True)
    assert not (await authorizer.authorize(user, log_attrs)).allowed
    assert kube.sar_calls[0]["spec"]["resourceAttributes"]["group"] == ""


@pytest.mark.parametrize(("method", "watch", "require_exec", "expected"), [
    ("GET", False, True, [("get", "subresources.aggapi.io", "copy"),
                          ("create", "", "exec")]),
    ("GET", False, False, [("get", "subresources.aggapi.io", "copy")]),
    ("HEAD", True, True, [("watch", "subresources.aggapi.io", "copy"),
                          ("get", "subresources.aggapi.io", "copy"),
                          ("create", "", "exec")]),
    ("HEAD", False, False, [("get", "subresources.aggapi.io", "copy")]),
    ("POST", False, True, [("create", "subresources.aggapi.io", "copy"),
                           ("create", "", "exec")]),
    ("POST", True, True, [("watch", "subresources.aggapi.io", "copy"),
                          ("create", "subresources.aggapi.io", "copy"),
                          ("create", "", "exec")]),
    ("POST", True, False, [("watch", "subresources.aggapi.io", "copy"),
                           ("create", "subresources.aggapi.io", "copy")]),
])
def test_copy_route_declares_every_check(method: str, watch: bool, require_exec: bool,
                                         expected: list[tuple[str, str, str]]) -> None:
    path = GV + ("/watch" if watch else "") + "/namespaces/ns1/pods/web-0/copy"
    info = parse(method, path)
    attrs = copy_authz(require_exec).attributes(info, method)
    assert [(a.verb, a.api_group, a.subresource) for a in attrs] == expected
    # Every check is about the object the handler will act on.
    assert {(a.namespace, a.resource, a.name) for a in attrs} == {("ns1", "pods", "web-0")}


# A read-everything role (get/list/watch on every resource of every group): it may get
# pods/copy but may not create pods/exec.
def _read_everything(spec: dict[str, Any]) -> bool:
    return spec["resourceAttributes"]["verb"] in ("get", "list", "watch")


COPY_PASSWD = GV + "/namespaces/ns1/pods/web-0/copy?path=/etc/passwd"


async def _as_reader(srv: Server, method: str) -> tuple[int, bytes]:
    cert = srv.certs.client_pair(srv.certs.client_ca, "rita")
    async with srv.session(cert).request(method, COPY_PASSWD) as resp:
        return resp.status, await resp.read()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_read_everything_role_cannot_read_files(make_server: Any, kube: FakeKube,
                                                      method: str) -> None:
    """Downloads and stat need create on core pods/exec, as uploads do (issue 24 finding
    1): a container's files hold its Secrets and projected ServiceAccount tokens."""
    srv = await make_server()
    kube.sar_policy = _read_everything
    code, raw = await _as_reader(srv, method)
    assert code == 403
    if method == "GET":
        body = json.loads(raw)
        assert body["kind"] == "Status" and body["reason"] == "Forbidden"
        assert 'User "rita" cannot create resource "pods/exec" in API group ""' \
            in body["message"]
    asked = [c["spec"]["resourceAttributes"] for c in kube.sar_calls]
    assert [(a["verb"], a["group"], a["subresource"]) for a in asked] == [
        ("get", "subresources.aggapi.io", "copy"), ("create", "", "exec")]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_copy_require_exec_false_lets_readers_read(make_server: Any, kube: FakeKube,
                                                         method: str) -> None:
    srv = await make_server(copy_require_exec=False)
    kube.sar_policy = _read_everything
    assert (await _as_reader(srv, method))[0] == 501  # authorized: the stub answers
    assert all(c["spec"]["resourceAttributes"]["subresource"] != "exec"
               for c in kube.sar_calls)
