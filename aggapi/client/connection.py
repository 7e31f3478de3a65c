"""An authenticated aiohttp session to kube-apiserver, configured from a kubeconfig.

The kubeconfig (or the pod's service account) is read by the product's own
:mod:`aggapi.kube.kubeconfig`, the loader the apiserver and agent use too, so neither
the client nor the kubectl plugins need a Kubernetes client library; exec
credential plugins are run by :mod:`aggapi.client.execcred`. Streams need no
total timeout and raw bodies, hence an aiohttp session of our own. Exec
credentials are refreshed the way kubectl does it: before a request once their
``expirationTimestamp`` passed, and once more after a 401. Configuration
problems come out as :class:`ConfigError`, never as another library's exception.

kubectl's global connection flags arrive as :class:`ConnectionFlags`: --cluster,
--user and the --server/--token/--certificate-authority/--insecure-skip-tls-verify
overrides are laid over the kubeconfig (or make one up when there is none),
--as/--as-group become Impersonate-* headers, --request-timeout a per-request
total timeout. Each request is logged to ``aggapi.client.http`` (INFO: method, URL,
status and time as kubectl -v=6 prints them; DEBUG: headers, as -v=7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDict

from aggapi.client.errors import AggapiError, ConfigError, Unauthorized, error_from_response
from aggapi.client.execcred import Credential, ExecPlugin
from aggapi.kube.kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    load_chain_from_memory,
    load_incluster,
    load_kubeconfig,
    parse_document,
    ssl_context,
)
from aggapi.serve.chunktakeover import takeover_connector
from aggapi.wire import GROUP_VERSION_PATH

http_log = logging.getLogger("aggapi.client.http")

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
    paths = [p.strip() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep)
             if p.strip()]
    if len(paths) < 2:
        return None, context
    docs: list[tuple[str, dict[str, Any]]] = []
    for p in paths:
        try:
            with open(os.path.expanduser(p), encoding="utf-8") as f:
                doc = parse_document(f.read())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            docs.append((p, doc))
    name = context or next((str(d["current-context"]) for _, d in docs
                            if d.get("current-context")), None)
    for p, doc in docs:
        if any(isinstance(c, dict) and c.get("name") == name for c in doc.get("contexts") or ()):
            return p, name
    return (docs[0][0] if docs else paths[0]), name


@dataclass(frozen=True)
class ConnectionFlags:
    """kubectl's global connection flags; None, empty or False: the kubeconfig's."""

    kubeconfig: str | None = None
    context: str | None = None
    cluster: str | None = None
    user: str | None = None
    namespace: str | None = None
    server: str | None = None
    token: str | None = None
    certificate_authority: str | None = None
    insecure_skip_tls_verify: bool = False
    impersonate: str | None = None  # --as
    impersonate_groups: tuple[str, ...] = ()  # --as-group, repeatable
    request_timeout: float | None = None  # seconds; None or 0: no limit

    def cluster_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.server:
            out["server"] = self.server
        if self.certificate_authority:  # a file given here replaces inline data too
            out["certificate-authority"] = os.path.abspath(self.certificate_authority)
            out["certificate-authority-data"] = None
        if self.insecure_skip_tls_verify:
            out.update({"insecure-skip-tls-verify": True, "certificate-authority": None,
                        "certificate-authority-data": None})
        return out

    def user_overrides(self) -> dict[str, Any]:
        # A token on the command line is the credential: no exec plugin, no token file.
        return {"token": self.token, "tokenFile": None, "exec": None} if self.token else {}

    def impersonation(self) -> list[tuple[str, str]]:
        """The headers of --as and --as-group (one header per group, as client-go)."""
        if not self.impersonate:
            if self.impersonate_groups:
                raise ConfigError.from_message("requesting groups (--as-group) without "
                                               "impersonating a user (--as)")
            return []
        return [("Impersonate-User", self.impersonate),
                *(("Impersonate-Group", g) for g in self.impersonate_groups)]


def _from_flags_only(flags: ConnectionFlags) -> ClusterConfig:
    """No kubeconfig at all, but --server: kubectl connects with the flags alone."""
    server = str(flags.server).rstrip("/")
    if not server.startswith(("https://", "http://")):
        server = "https://" + server
    tls = None
    if server.startswith("https://"):
        try:
            tls = ssl_context(ca_file=flags.certificate_authority,
                              verify=not flags.insecure_skip_tls_verify)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError.from_message(f"--certificate-authority: {exc}") from exc
    return ClusterConfig(server=server, ssl_context=tls, token=flags.token)


def _missing_kubeconfig(flags: ConnectionFlags) -> str | None:
    """Why no kubeconfig can be read (kubectl's places, in its order), or None."""
    if flags.kubeconfig:
        if not os.path.exists(flags.kubeconfig):
            return f"cannot read kubeconfig {flags.kubeconfig}: no such file (--kubeconfig)"
        return None
    env = [p.strip() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p.strip()]
    if env:
        if not any(os.path.exists(os.path.expanduser(p)) for p in env):
            return ("cannot read kubeconfig: no file of $KUBECONFIG exists "
                    f"({', '.join(env)})")
        return None
    if not _default_kubeconfig_exists():
        return ("no configuration has been provided: ~/.kube/config does not exist and "
                "neither --kubeconfig, $KUBECONFIG nor --server was given")
    return None


async def _config(load: Callable[[], ClusterConfig]) -> ClusterConfig:
    try:
        return await asyncio.to_thread(load)
    except KubeConfigError as exc:
        raise ConfigError.from_message(str(exc)) from exc


class Connection:
    """One cluster endpoint with its credentials; use as an async context manager."""

    def __init__(self, config: ClusterConfig, *, namespace: str | None = None,
                 exec_plugin: ExecPlugin | None = None,
                 flags: ConnectionFlags | None = None) -> None:
        self.config = config
        self.flags = flags or ConnectionFlags()
        self.namespace = (self.flags.namespace or namespace or config.namespace or "default")
        self.exec_plugin = exec_plugin
        self._impersonation = self.flags.impersonation()
        self._ssl = config.ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []  # may still carry a response
        self._cert: tuple[bytes | None, bytes | None] = (None, None)

    # --- construction ----------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(cls, kubeconfig: str | None = None,
                              context: str | None = None, *,
                              flags: ConnectionFlags | None = None) -> Connection:
        """Load ``kubeconfig`` (default: $KUBECONFIG, a list, or ~/.kube/config)."""
        f = flags or ConnectionFlags()
        if not kubeconfig:
            kubeconfig, context = await asyncio.to_thread(pick_kubeconfig, context)
        cfg = await _config(lambda: load_kubeconfig(
            kubeconfig or None, context, allow_exec=True, cluster_name=f.cluster,
            user_name=f.user, cluster_overrides=f.cluster_overrides(),
            user_overrides=f.user_overrides()))
        plugin = ExecPlugin(cfg.exec_spec, cfg.base_dir) if cfg.exec_spec else None
        return cls(cfg, exec_plugin=plugin, flags=f)

    @classmethod
    async def in_cluster(cls, flags: ConnectionFlags | None = None) -> Connection:
        cfg = await _config(load_incluster)
        return cls(cfg, namespace=await asyncio.to_thread(_incluster_namespace), flags=flags)

    @classmethod
    async def load(cls, kubeconfig: str | None = None, context: str | None = None, *,
                   flags: ConnectionFlags | None = None) -> Connection:
        """kubectl's order: an explicit or $KUBECONFIG file, ~/.kube/config, in-cluster;
        --server with no kubeconfig at all connects with the flags alone."""
        f = flags or ConnectionFlags(kubeconfig=kubeconfig, context=context)
        missing = await asyncio.to_thread(_missing_kubeconfig, f)
        if missing is None:
            return await cls.from_kubeconfig(f.kubeconfig, f.context, flags=f)
        if f.server and not f.kubeconfig:
            return cls(_from_flags_only(f), flags=f)
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not (
                f.kubeconfig or os.environ.get("KUBECONFIG")):
            return await cls.in_cluster(f)
        raise ConfigError.from_message(missing)

    # --- session ---------------------------------------------------------------------
    @property
    def server(self) -> str:
        return self.config.server.rstrip("/")

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A directory download's chunked tar is decrypted into buffers of our own.
            conn = takeover_connector(ssl=self._ssl if self._ssl is not None else True,
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
            hdrs: CIMultiDict[str] = CIMultiDict(await self.headers())
            hdrs.extend(self._impersonation)
            hdrs.update(headers or {})
            data = body() if callable(body) else body
            kw: dict[str, Any] = {}
            if self.config.tls_server_name:
                kw["server_hostname"] = self.config.tls_server_name
            if self.flags.request_timeout:
                kw["timeout"] = aiohttp.ClientTimeout(total=self.flags.request_timeout)
            resp = await self._send(method, path, params, hdrs, data, kw)
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

    async def _send(self, method: str, path: str, params: Params | None,
                    hdrs: CIMultiDict[str], data: Any, kw: dict[str, Any],
                    ) -> aiohttp.ClientResponse:
        t0 = time.monotonic()
        url = self.server + path
        if http_log.isEnabledFor(logging.DEBUG):
            http_log.debug("Request Headers: %s", _shown(hdrs))
        try:
            resp = await self.session().request(method, url, params=params, headers=hdrs,
                                                data=data, **kw)
        except BaseException:
            http_log.info("%s %s  in %d milliseconds", method, url, _ms(t0))
            raise
        http_log.info("%s %s %d %s in %d milliseconds", method, resp.url, resp.status,
                      resp.reason or "", _ms(t0))
        if http_log.isEnabledFor(logging.DEBUG):
            http_log.debug("Response Headers: %s", _shown(resp.headers))
        return resp


def _ms(t0: float) -> int:
    return round((time.monotonic() - t0) * 1000)


def _shown(headers: Mapping[str, str]) -> str:
    # As kubectl -v=7: the bearer token never reaches a log.
    return ", ".join(f"{k}: {'Bearer <masked>' if k.lower() == 'authorization' else v}"
                     for k, v in headers.items())


async def _error_body(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.content.read(1 << 20)
    except aiohttp.ClientError:
        return b""


__all__ = ["AggapiError", "ConfigError", "Connection", "ConnectionFlags",
           "subresource_path"]
