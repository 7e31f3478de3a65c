"""An aggapi apiserver whose collections read a FakeKube and a scripted agent,
reached through an aggregator-like front proxy as alice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.routes import Route
from tests.framework.fakekube import FakeKube
from tests.framework.frontproxy import FrontProxy, ProxyUser

from ..conftest import FRONT_PROXY_CN, GV, Server
from .fakes import FakeAgent

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;" \
        "v=v1beta1;g=meta.k8s.io,application/json"


@dataclass
class Env:
    server: Server
    proxy: FrontProxy
    kube: FakeKube
    agent: FakeAgent

    @property
    def feeds(self) -> Feeds:
        return self.server.parts.feeds

    async def get(self, path: str, token: str = "alice-token",
                  accept: str = "application/json") -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(
                self.proxy.url + GV + path,
                headers={"Authorization": f"Bearer {token}", "Accept": accept}) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text.startswith("{") else text


@pytest.fixture
async def env(make_server: Any, kube: FakeKube) -> AsyncIterator[Env]:
    agent = FakeAgent()
    kube.sar_policy = lambda _spec: True

    def setup(parts: Parts) -> list[Route]:
        # The scripted agent behind the collections (the routes take parts.feeds).
        parts.feeds = Feeds(Sources(parts.kube_api, linger=1.0), cast(AgentClient, agent),
                            linger=1.0,
                            poll_interval=0.05)
        return []

    server: Server = await make_server(setup=setup)
    cert, key = server.certs.client_pair(server.certs.front_proxy_ca, FRONT_PROXY_CN)
    fp = FrontProxy(server.url, client_cert=cert, client_key=key,
                    backend_ca=server.certs.path("serving-ca.crt"),
                    users={"alice-token": ProxyUser("alice", groups=("devs",)),
                           "bob-token": ProxyUser("bob")})
    await fp.start()
    yield Env(server, fp, kube, agent)
    await fp.stop()
