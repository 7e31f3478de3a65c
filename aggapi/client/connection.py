"""An authenticated aiohttp session to kube-apiserver, configured from a kubeconfig.

The kubeconfig (or the pod's service account) is read by the product's own
:mod:`aggapi.kubeconfig`, the loader the apiserver and agent use too, so neither
the client nor the kubectl plugins need a Kubernetes client library; exec
credential plugins are run by :mod:`aggapi.client.execcred`. Streams need no
total timeout and raw bodies, hence an aiohttp session of our own. Exec
credentials are refreshed the way kubectl does it: before a request once their
``expirationTimestamp`` passed, and once more after a 401. Configuration
problems come out as :class:`ConfigError`, never as another library's exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp

from aggapi.client.errors import AggapiError, ConfigError, Unauthorized, error_from_response
from aggapi.client.execcred import Credential, ExecPlugin
from aggapi.kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    load_chain_from_memory,
    load_incluster,
    load_kubeconfig,
)
from aggapi.wire import GROUP_VERSION_PATH

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

Params = Sequence[tuple[str, str]] | Mapping[str, str]
Body = bytes | Callable[[], Any] | None


def subresource_path(namespace: str, pod: str, subresource: str, *, watch: bool = True) -> str:
    """The pod subresource's path; the ``/watch/`` form is long-running in kube-apiserver
    (no 60 s cut; RBAC checks verb ``watch`` there)."""
    w = "watch/" if watch else ""
    return (f"{GROUP_VERSION_PATH}/{w}namespaces/{quote(namespace, safe='')}"
            f"/pods/{quote(pod, safe='')}/{subresource}")


def _incluster_namespace() -> str:
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _default_kubeconfig_exists() -> bool:
    return os.path.exists(os.path.expanduser("~/.kube/config"))


def _read_token(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def pick_kubeconfig(context: str | None) -> tuple[str | None, str | None]:
    """(file, context) to load when $KUBECONFIG lists several files, as kubectl reads
    them: the first current-context set wins, and the first file naming that context
    is used (each file is expected to hold its context's cluster and user); missing
    or unreadable files are skipped. (None, context): leave it to the default."""
    import yaml  # PyYAML, as aggapi.kubeconfig uses it

    paths = [p.strip() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep)
             if p.strip()]
    if len(paths) < 2:
        return None, context
    docs: list[tuple[str, dict[str, Any]]] = []
    for p in paths:
        try:
            with open(os.path.expanduser(p), encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            docs.append((p, doc))
    name = context or next((str(d["current-context"]) for _, d in docs
                            if d.get("current-context")), None)
    for p, doc in docs:
        if any(isinstance(c, dict) and c.get("name") == name for c in doc.get("contexts") or ()):
            return p, name
    return (docs[0][0] if docs else paths[0]), name


async def _config(load: Callable[[], ClusterConfig]) -> ClusterConfig:
    try:
        return await asyncio.to_thread(load)
    except KubeConfigError as exc:
        raise ConfigError.from_message(str(exc)) from exc


class Connection:
    """One cluster endpoint with its credentials; use as an async context manager."""

    def __init__(self, config: ClusterConfig, *, namespace: str | None = None,
                 exec_plugin: ExecPlugin | None = None) -> None:
        self.config = config
        self.namespace = namespace or config.namespace or "default"
        self.exec_plugin = exec_plugin
        self._ssl = config.ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []  # may still carry a response
        self._cert: tuple[bytes | None, bytes | None] = (None, None)

    # --- construction ----------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(cls, kubeconfig: str | None = None,
                              context: str | None = None) -> Connection:
        """Load ``kubeconfig`` (default: $KUBECONFIG, a list, or ~/.kube/config)."""
        if not kubeconfig:
            kubeconfig, context = await asyncio.to_thread(pick_kubeconfig, context)
        cfg = await _config(lambda: load_kubeconfig(kubeconfig or None, context,
                                                    allow_exec=True))
        plugin = ExecPlugin(cfg.exec_spec, cfg.base_dir) if cfg.exec_spec else None
        return cls(cfg, exec_plugin=plugin)

    @classmethod
    async def in_cluster(cls) -> Connection:
        cfg = await _config(load_incluster)
        return cls(cfg, namespace=await asyncio.to_thread(_incluster_namespace))

    @classmethod
    async def load(cls, kubeconfig: str | None = None, context: str | None = None,
                   ) -> Connection:
        """kubectl's order: an explicit or $KUBECONFIG file, ~/.kube/config, in-cluster."""
        if (kubeconfig or os.environ.get("KUBECONFIG") or _default_kubeconfig_exists()
                or not os.environ.get("KUBERNETES_SERVICE_HOST")):
            return await cls.from_kubeconfig(kubeconfig, context)
        return await cls.in_cluster()

    # --- session ---------------------------------------------------------------------
    @property
    def server(self) -> str:
        return self.config.server.rstrip("/")

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True,
                                        limit=8)
            # No total timeout: progress streams and large copies last as long as they last.
            self._session = aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                read_bufsize=1 << 20)
        return self._session

    async def close(self) -> None:
        for s in [*self._retired, *([self._session] if self._session else [])]:
            await s.close()
        self._retired.clear()
        self._session = None

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- credentials -----------------------------------------------------------------
    async def _refresh_after_401(self) -> bool:
        if self.exec_plugin is None:
            return False
        await self._take(await self.exec_plugin.credential(force=True))
        return True

    async def _take(self, cred: Credential) -> None:
        cert = (cred.cert, cred.key)
        if cred.cert and cred.key and cert != self._cert and self._ssl is not None:
            # A plugin that hands out client certificates: new TLS identity, so new
            # connections (the old session may still carry a response: retire it).
            await asyncio.to_thread(load_chain_from_memory, self._ssl, cred.cert, cred.key)
            self._cert = cert
            if self._session is not None:
                self._retired.append(self._session)
                self._session = None

    async def headers(self) -> dict[str, str]:
        token = self.config.token
        if self.exec_plugin is not None:
            cred = await self.exec_plugin.credential()
            await self._take(cred)
            token = cred.token or token
        elif self.config.token_file:
            try:  # re-read every time: projected tokens rotate
                token = await asyncio.to_thread(_read_token, self.config.token_file)
            except OSError as exc:
                raise ConfigError.from_message(f"token file {self.config.token_file}: "
                                               f"{exc.strerror}") from exc
        return {"Authorization": f"Bearer {token}"} if token else {}

    # --- requests --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def request(self, method: str, path: str, *, params: Params | None = None,
                      headers: Mapping[str, str] | None = None, body: Body = None,
                      ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request; an HTTP error comes out as a typed :class:`AggapiError`.

        ``body`` is bytes or a zero-argument callable returning a fresh body (an
        async iterator for streaming uploads), so a 401 can be retried."""
        for attempt in (0, 1):
            hdrs = {**(await self.headers()), **(headers or {})}
            data = body() if callable(body) else body
            kw: dict[str, Any] = {}
            if self.config.tls_server_name:
                kw["server_hostname"] = self.config.tls_server_name
            resp = await self.session().request(method, self.server + path, params=params,
                                                headers=hdrs, data=data, **kw)
            try:
                if resp.status >= 400:
                    err = error_from_response(resp.status, await _error_body(resp),
                                              resp.headers)
                    if (isinstance(err, Unauthorized) and attempt == 0
                            and await self._refresh_after_401()):
                        continue
                    raise err
                yield resp
                return
            finally:
                resp.release()
        raise AssertionError("unreachable")  # pragma: no cover


async def _error_body(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.content.read(1 << 20)
    except aiohttp.ClientError:
        return b""


__all__ = ["AggapiError", "ConfigError", "Connection", "subresource_path"]
