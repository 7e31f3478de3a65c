"""An authenticated aiohttp session to kube-apiserver, configured from a kubeconfig.

kubernetes-asyncio's config loader reads the kubeconfig (contexts, client
certificates, tokens, exec credential plugins) into a ``Configuration``; this
module turns that into an aiohttp session of its own, because aggapi's streams
need no total timeout and raw bodies, which the generated ``ApiClient`` does not
offer. Exec credentials are refreshed the way kubectl does it: before a request
once their ``expirationTimestamp`` passed, and once more after a 401.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import Configuration

from aggapi.client.errors import AggapiError, Unauthorized, error_from_response

GROUP = "subresources.aggapi.io"
VERSION = "v1alpha1"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

Params = Sequence[tuple[str, str]] | Mapping[str, str]
Body = bytes | Callable[[], Any] | None


def subresource_path(namespace: str, pod: str, subresource: str, *, watch: bool = True) -> str:
    """The pod subresource's path; the ``/watch/`` form is long-running in kube-apiserver
    (no 60 s cut; RBAC checks verb ``watch`` there)."""
    w = "watch/" if watch else ""
    return (f"/apis/{GROUP}/{VERSION}/{w}namespaces/{quote(namespace, safe='')}"
            f"/pods/{quote(pod, safe='')}/{subresource}")


def _incluster_namespace() -> str:
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _default_kubeconfig_exists() -> bool:
    return os.path.exists(os.path.expanduser("~/.kube/config"))


def _ssl_context(cfg: Configuration) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Connection:
    """One cluster endpoint with its credentials; use as an async context manager."""

    def __init__(self, configuration: Configuration, *, namespace: str = "default",
                 loader: Any = None) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.loader = loader  # KubeConfigLoader, kept to re-run exec plugins
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []  # may still carry a response
        self._cert: tuple[str | None, str | None] = (configuration.cert_file,
                                                     configuration.key_file)
        if self._uses_exec():
            configuration.refresh_api_key_hook = self._refresh_if_expired

    # --- construction ----------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(cls, kubeconfig: str | None = None,
                              context: str | None = None) -> Connection:
        """Load ``kubeconfig`` (default: $KUBECONFIG, a list, or ~/.kube/config)."""
        cfg = type.__call__(Configuration)
        loader = await kconfig.load_kube_config(
            config_file=kubeconfig or None, context=context, client_configuration=cfg,
            persist_config=False)
        ctx = loader.current_context or {}
        ns = (ctx.get("context") or {}).get("namespace") or "default"
        return cls(cfg, namespace=ns, loader=loader)

    @classmethod
    async def in_cluster(cls) -> Connection:
        cfg = type.__call__(Configuration)
        kconfig.load_incluster_config(client_configuration=cfg)
        return cls(cfg, namespace=_incluster_namespace())

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
        return str(self.configuration.host).rstrip("/")

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(ssl=_ssl_context(self.configuration), limit=8)
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
    def _uses_exec(self) -> bool:
        user = getattr(self.loader, "_user", None)
        return user is not None and "exec" in user

    async def _refresh_if_expired(self, cfg: Configuration) -> None:
        # load_from_exec_plugin is a no-op while a known expiry lies ahead; without an
        # expiry it would run the plugin for every request, so leave that to the 401 path.
        if hasattr(self.loader, "exec_plugin_expiry"):
            await self.loader.load_from_exec_plugin()
            self._take_exec_result()

    async def _refresh_after_401(self) -> bool:
        if not self._uses_exec():
            return False
        with contextlib.suppress(AttributeError):
            del self.loader.exec_plugin_expiry
        await self.loader.load_from_exec_plugin()
        self._take_exec_result()
        return True

    def _take_exec_result(self) -> None:
        token = getattr(self.loader, "token", None)
        if token:
            self.configuration.api_key["BearerToken"] = token
        cert = (getattr(self.loader, "cert_file", None), getattr(self.loader, "key_file", None))
        if cert[0] and cert != self._cert:
            # A plugin that hands out client certificates: new TLS identity, new session.
            self.configuration.cert_file, self.configuration.key_file = cert
            self._cert = cert
            if self._session is not None:
                self._retired.append(self._session)
                self._session = None

    async def headers(self) -> dict[str, str]:
        auth = await self.configuration.auth_settings()
        out: dict[str, str] = {}
        tok = auth.get("BearerToken")
        if tok and tok.get("value"):
            out["Authorization"] = str(tok["value"])
        return out

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
            if self.configuration.tls_server_name:
                kw["server_hostname"] = self.configuration.tls_server_name
            if self.configuration.proxy:
                kw["proxy"] = self.configuration.proxy
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


__all__ = ["AggapiError", "Connection", "subresource_path"]
