"""The cluster's authentication settings for extension servers, kept current.

kube-apiserver publishes them in ConfigMap kube-system/extension-apiserver-authentication
(its client CA, the front-proxy CA, allowed front-proxy CNs and the X-Remote-*
header names). We list it, then watch it, so rotations take effect without a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from aggapi.kube.client import KubeClient, path_segment
from aggapi.kube.informer import Informer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthConfig:
    client_ca_pem: bytes = b""
    client_cas: tuple[x509.Certificate, ...] = ()
    requestheader_ca_pem: bytes = b""
    requestheader_cas: tuple[x509.Certificate, ...] = ()
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ()
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()
    resource_version: str = ""
    # Why front-proxy authentication is off ("" when the settings are valid).
    requestheader_error: str = ""

    @property
    def notices(self) -> tuple[str, ...]:
        """What this cluster's settings leave out and how aggapi does without it: older
        releases publish fewer keys, and aggapi serves them in a reduced form instead of
        failing."""
        if self.requestheader_error or not self.requestheader_cas or self.uid_headers:
            return ()
        # kube-apiserver writes the key since 1.32 (--requestheader-uid-headers).
        return ("requestheader-uid-headers is not published (kube-apiserver before 1.32, "
                "or the flag unset): front-proxy users are authenticated without a UID, and "
                "aggapi's SubjectAccessReviews carry none",)


class _Malformed(ValueError):
    pass


def _header_list(data: Mapping[str, str], key: str) -> tuple[str, ...]:
    """A requestheader-* list: a JSON array of non-blank strings, as kube-apiserver
    writes it. An absent key is the empty list; anything else raises _Malformed."""
    raw = data.get(key)
    if raw is None:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        raise _Malformed(f"{key} is not JSON: {raw[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip()
                                              for v in value):
        raise _Malformed(f"{key} is not a JSON array of non-empty strings: {raw[:80]!r}")
    return tuple(value)


def parse_certs(pem: bytes, what: str) -> tuple[x509.Certificate, ...]:
    if not pem.strip():
        return ()
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        log.error("cannot parse %s: %s", what, exc)
        return ()


def parse_configmap(data: Mapping[str, str], resource_version: str = "") -> AuthConfig:
    """The ConfigMap's settings. A malformed requestheader-* list disables front-proxy
    (request header) authentication: the front-proxy CA is dropped, so no header
    identity is believed until the value is fixed (``requestheader_error`` says why).
    Guessing would fail open: an unreadable allowed-names list is not "any name"."""
    client_pem = data.get("client-ca-file", "").encode()
    rh_pem = data.get("requestheader-client-ca-file", "").encode()
    lists: dict[str, tuple[str, ...]] = {}
    errors: list[str] = []
    for key in ("requestheader-allowed-names", "requestheader-username-headers",
                "requestheader-uid-headers", "requestheader-group-headers",
                "requestheader-extra-headers-prefix"):
        try:
            lists[key] = _header_list(data, key)
        except _Malformed as exc:
            lists[key] = ()
            errors.append(str(exc))
    if errors:
        rh_pem = b""
    return AuthConfig(
        client_ca_pem=client_pem,
        client_cas=parse_certs(client_pem, "client-ca-file"),
        requestheader_ca_pem=rh_pem,
        requestheader_cas=parse_certs(rh_pem, "requestheader-client-ca-file"),
        allowed_names=lists["requestheader-allowed-names"],
        username_headers=lists["requestheader-username-headers"],
        uid_headers=lists["requestheader-uid-headers"],
        group_headers=lists["requestheader-group-headers"],
        extra_prefixes=lists["requestheader-extra-headers-prefix"],
        resource_version=resource_version,
        requestheader_error="; ".join(errors),
    )


Listener = Callable[[AuthConfig], Awaitable[None]]


class AuthConfigSource:
    """Lists then watches the ConfigMap; ``current`` is None until first read."""

    def __init__(self, api: KubeClient, namespace: str = "kube-system",
                 name: str = "extension-apiserver-authentication", *,
                 max_backoff: float = 10.0) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.max_backoff = max_backoff
        self.current: AuthConfig | None = None
        self.ready = asyncio.Event()
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def _apply(self, cm: Mapping[str, Any]) -> None:
        rv = str((cm.get("metadata") or {}).get("resourceVersion") or "")
        cfg = parse_configmap(cm.get("data") or {}, rv)
        changed = self.current is None or cfg != self.current
        self.current = cfg
        self.ready.set()
        if changed:
            log.info("authentication config loaded", extra={"resourceVersion": rv})
            for notice in cfg.notices:
                log.warning("%s/%s: %s", self.namespace, self.name, notice,
                            extra={"resourceVersion": rv})
            if cfg.requestheader_error:
                log.error("front-proxy (request header) authentication is refused until "
                          "%s/%s is fixed: %s", self.namespace, self.name,
                          cfg.requestheader_error, extra={"resourceVersion": rv})
            for listener in self._listeners:
                await listener(cfg)

    async def run(self) -> None:
        """Follow the ConfigMap through a list+watch cache (relists, backs off)."""
        informer = Informer(self.api,
                            f"/api/v1/namespaces/{path_segment(self.namespace)}/configmaps",
                            {"fieldSelector": f"metadata.name={self.name}"},
                            max_backoff=self.max_backoff)
        changed = asyncio.Event()
        informer.add_listener(lambda _kind, _obj: changed.set())
        informer.start()
        try:
            while True:
                await changed.wait()
                changed.clear()
                cm = informer.items.get(f"{self.namespace}/{self.name}")
                if cm is not None:
                    await self._apply(cm)
                elif self.current is not None:
                    # Keep serving with the last known config (as kube does).
                    log.warning("authentication configmap deleted")
                else:
                    log.warning("configmap %s/%s not found yet", self.namespace, self.name)
        finally:
            await informer.stop()
