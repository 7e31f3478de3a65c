"""An apiserver app on plain HTTP whose every outside part is a recording fake:
SubjectAccessReviews, pod reads, pod watches and the node agents.

It lets a test compare, request by request, what was authorized with what was
executed (the pod looked up or watched, the agent operation sent), and send any
raw request line, percent-encodings and dot segments untouched by a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestServer

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentDirectory, AgentEndpoint
from aggapi.apiserver.app import new_app
from aggapi.apiserver.authconfig import AuthConfigSource, parse_configmap
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.imagepullprogress.podwatch import PodWatch, PodWatchHub
from aggapi.apiserver.parts import complete
from aggapi.apiserver.podsources import Sources
from aggapi.auth.delegated import SUBJECTACCESSREVIEWS
from aggapi.kube.client import KubeClient
from aggapi.status import StatusError

NODE = "node-1"
Spec = dict[str, Any]


def pod(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "uid": "uid-1"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox"}]},
            "status": {}}


class FakeApi(KubeClient):
    """Answers SubjectAccessReviews with ``allow`` and serves any pod asked for."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")  # never contacted
        self.allow: Callable[[Spec], bool] = lambda _spec: True
        self.sars: list[Spec] = []
        self.pods_read: list[tuple[str, str]] = []
        self.nodes_listed: list[str] = []

    async def post(self, path: str, body: Any, *, params: Any = None,
                   timeout: float | None = None) -> dict[str, Any]:
        assert path == SUBJECTACCESSREVIEWS, path
        self.sars.append(body["spec"])
        return {"status": {"allowed": self.allow(body["spec"])}}

    async def get(self, path: str, params: Any = None, *,
                  timeout: float | None = None) -> dict[str, Any]:
        if path == "/api/v1/pods":
            self.nodes_listed.append(params["fieldSelector"].split("=", 1)[1])
            return {"items": []}
        _api, _v1, _namespaces, ns, _pods, name = path.strip("/").split("/")
        key = (urllib.parse.unquote(ns), urllib.parse.unquote(name))
        self.pods_read.append(key)
        return pod(*key)


class FakeWatch(PodWatch):
    def __init__(self, namespace: str, name: str) -> None:  # no informers
        self.namespace, self.name, self.version = namespace, name, 1

    async def synced(self, timeout: float = 10.0) -> None:
        return None

    @property
    def pod(self) -> dict[str, Any] | None:
        return pod(self.namespace, self.name)

    @property
    def events(self) -> list[Mapping[str, Any]]:
        return []

    async def wait_changed(self, since: int, timeout: float) -> int:
        await asyncio.sleep(timeout)
        return self.version


class FakeHub(PodWatchHub):
    def __init__(self) -> None:
        super().__init__(Sources(FakeApi(), linger=0))
        self.watched: list[tuple[str, str]] = []

    @contextlib.asynccontextmanager
    async def watch(self, namespace: str, name: str) -> AsyncIterator[PodWatch]:
        self.watched.append((namespace, name))
        yield FakeWatch(namespace, name)


class FakeDirectory(AgentDirectory):
    def __init__(self) -> None:  # no informer
        pass

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    @property
    def synced(self) -> bool:
        return True

    async def endpoint(self, node: str, sync_timeout: float = 5.0) -> AgentEndpoint:
        return AgentEndpoint(node=node, address="127.0.0.1", port=9)


class FakeAgent(AgentClient):
    """Records every request it is asked to make, then fails it (502)."""

    def __init__(self) -> None:  # no TLS, no signer
        self.directory = FakeDirectory()
        self.key_publisher = None
        self.pins = None
        self.calls: list[dict[str, Any]] = []

    async def close(self) -> None:
        pass

    async def open(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append({"method": method, "path": path, **kwargs})
        raise StatusError(502, "fake agent")


class FakeAuthSource(AuthConfigSource):
    """Loaded at once (anonymous requests only: no CAs)."""

    def __init__(self, api: KubeClient) -> None:
        super().__init__(api)
        self.current = parse_configmap({})
        self.ready.set()

    async def run(self) -> None:
        await asyncio.Event().wait()


class _AnyPath:
    def __contains__(self, _path: object) -> bool:
        return True


@dataclass
class Env:
    server: TestServer
    api: FakeApi
    hub: FakeHub
    agent: FakeAgent

    @classmethod
    async def start(cls, **config: Any) -> Env:
        api, hub, agent = FakeApi(), FakeHub(), FakeAgent()
        cfg = ApiServerConfig(**{"anonymous_auth": True, "authz_allow_ttl": 0,
                                 "authz_deny_ttl": 0, "stream_deadline": 5.0, **config})
        parts = complete(cfg, kube_api=api, auth_source=FakeAuthSource(api))
        parts.agent, parts.pod_watches = agent, hub
        # These tests send unauthenticated requests to see what reaches authorization:
        # anonymous is let through on every path (the product allows only the probes).
        parts.authenticator.anonymous_paths = _AnyPath()
        server = TestServer(new_app(parts), host="127.0.0.1")
        await server.start_server()
        return cls(server, api, hub, agent)

    def reset(self) -> None:
        self.api.sars.clear()
        self.api.pods_read.clear()
        self.api.nodes_listed.clear()
        self.hub.watched.clear()
        self.agent.calls.clear()

    async def send(self, method: str, target: str) -> int:
        """Send ``target`` as the raw request-target; the response's status code."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        try:
            writer.write(f"{method} {target} HTTP/1.1\r\nHost: aggapi\r\n"
                         "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            status = await reader.readline()
            await reader.read()  # to the end: the handler has finished
            return int(status.split()[1])
        finally:
            writer.close()

    async def stop(self) -> None:
        await self.server.close()
