"""Strict copy requests (issue 35): a query parameter that no copy verb takes is a 400
BadRequest naming it, at the apiserver, before anything reaches the agent, as
kube-apiserver refuses an unknown field under strict validation. A misspelled
``overwite=false`` used to be dropped and the upload overwrote. What kubectl adds for
kube-apiserver itself (``timeout=`` from --request-timeout) still passes, and never
reaches the agent. The agent is a stand-in that records what it is asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import MultiDict

from aggapi.status import StatusError
from aggapi.tls import certs as aggapi_certs
from tests.framework.fakekube import FakeKube

from ..conftest import GV
from .conftest import relay_to_standin, serve_standin_agent

URL = f"{GV}/namespaces/default/pods/box/copy"
BASE = [("container", "app"), ("path", "/tmp/f")]


@pytest.fixture
async def relay(tmp_path: Path, make_server: Any, kube: FakeKube
                ) -> AsyncIterator[tuple[aiohttp.ClientSession, list[web.Request]]]:
    pki_dir = tmp_path / "agent-pki"
    aggapi_certs.generate(pki_dir)
    seen: list[web.Request] = []

    async def copy(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        if request.method == "POST":
            await request.read()
            return web.json_response({"path": "/tmp/f", "size": 0, "sha256": ""})
        return web.Response(body=b"" if request.method == "HEAD" else b"data")

    app = web.Application()
    app.router.add_route("*", "/v1/copy", copy)
    runner, port = await serve_standin_agent(app, pki_dir)
    try:
        srv = await relay_to_standin(make_server, kube, pki_dir, port)
        yield srv.session(srv.certs.client_pair(srv.certs.client_ca, "carol")), seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("method", "extra"), [
    ("POST", [("overwite", "false")]),
    ("POST", [("Overwrite", "false")]),
    ("POST", [("pth", "/tmp/g")]),
    ("GET", [("pth", "/tmp/g")]),
    ("GET", [("overwrite", "false")]),  # an upload's parameter, not a download's
    ("HEAD", [("digets", "trailer")]),
    ("GET", [("Symlink", "keep"), ("x", "1")]),
])
async def test_an_unknown_parameter_is_a_400_naming_it_and_reaches_no_agent(
        relay: Any, method: str, extra: list[tuple[str, str]]) -> None:
    s, seen = relay
    async with s.request(method, URL, params=[*BASE, *extra], data=b"new" if method == "POST"
                         else None) as resp:
        assert resp.status == 400
        if method != "HEAD":
            status = await resp.json()
            assert status["kind"] == "Status" and status["reason"] == "BadRequest"
            for name, _ in extra:
                assert repr(name) in status["message"], status["message"]
    assert seen == []


async def test_a_parameter_given_twice_is_a_400(relay: Any) -> None:
    s, seen = relay
    async with s.get(URL, params=[*BASE, ("path", "/etc/shadow")]) as resp:
        assert resp.status == 400
        assert "'path' given more than once" in (await resp.json())["message"]
    assert seen == []


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
async def test_known_parameters_and_kubectls_timeout_pass(relay: Any, method: str) -> None:
    """kubectl get/create --raw --request-timeout=5s adds timeout=5s (checked with
    kubectl 1.37 -v=6); it is kube-apiserver's, so it passes and is not relayed."""
    s, seen = relay
    extra = {"GET": [("digest", "trailer"), ("symlink", "keep")],
             "HEAD": [("symlink", "keep")],
             "POST": [("overwrite", "false"), ("mode", "644")]}[method]
    async with s.request(method, URL, params=[*BASE, *extra, ("timeout", "5s")],
                         data=b"new" if method == "POST" else None) as resp:
        assert resp.status == 200, await resp.text()
    assert len(seen) == 1
    assert "timeout" not in seen[0].query
    assert {k: seen[0].query[k] for k, _ in extra} == dict(extra)


@pytest.mark.parametrize(("method", "names"), [
    ("POST", ["container", "path", "overwite"]),
    ("GET", ["path", "timeout"]),  # the apiserver never relays it
    ("HEAD", ["path", "path"]),
])
def test_the_agent_refuses_them_too(method: str, names: list[str]) -> None:
    from aggapi.agent.copy.uploadparams import strict_query

    with pytest.raises(StatusError) as err:
        strict_query(method, MultiDict([(n, "x") for n in names]))
    assert err.value.code == 400


def test_the_agent_takes_every_known_parameter() -> None:
    from aggapi.agent.copy.uploadparams import strict_query

    strict_query("POST", MultiDict([(n, "x") for n in
                                    ("container", "path", "overwrite", "mode", "uid", "gid",
                                     "sha256", "format")]))
    strict_query("GET", MultiDict([(n, "x") for n in ("container", "path", "digest",
                                                       "symlink")]))
