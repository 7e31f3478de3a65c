"""Exec credential plugins (``client.authentication.k8s.io``), run as kubectl runs them.

A kubeconfig user with an ``exec`` entry names a command that prints an
ExecCredential: a bearer token and/or a client certificate, optionally with an
expiry. The credential is cached and fetched again once it expired, or when the
server answered 401 (the caller forces it). ``KUBERNETES_EXEC_INFO`` tells the
plugin whether it may prompt; the plugin's stderr goes to the user's terminal.
Every failure comes out as :class:`ConfigError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aggapi.client.errors import ConfigError

# Fetch a little before the stated expiry, so a request does not race it.
EXPIRY_MARGIN = 10.0


@dataclass(frozen=True)
class Credential:
    token: str | None = None
    cert: bytes | None = None  # PEM client certificate (with cert: its key)
    key: bytes | None = None
    expires: float | None = None  # time.time() seconds; None: until a 401

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires - EXPIRY_MARGIN


def parse_credential(raw: bytes, command: str) -> Credential:
    """The credential in an exec plugin's stdout."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError.from_message(f"exec plugin {command}: output is not JSON") from exc
    status = doc.get("status") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential" \
            or not isinstance(status, dict):
        raise ConfigError.from_message(f"exec plugin {command}: output is not an "
                                       "ExecCredential with a status")
    token, cert, key = (status.get(k) for k in ("token", "clientCertificateData",
                                                 "clientKeyData"))
    if not all(v is None or isinstance(v, str) for v in (token, cert, key)) \
            or bool(cert) != bool(key) or not (token or cert):
        raise ConfigError.from_message(f"exec plugin {command}: the ExecCredential holds "
                                       "neither a token nor a client certificate and key")
    expires = None
    if status.get("expirationTimestamp"):
        try:
            expires = datetime.fromisoformat(str(status["expirationTimestamp"])).timestamp()
        except ValueError as exc:
            raise ConfigError.from_message(f"exec plugin {command}: bad "
                                           "expirationTimestamp") from exc
    return Credential(token or None, cert.encode() if cert else None,
                      key.encode() if key else None, expires)


class ExecPlugin:
    """One kubeconfig ``exec`` entry and its cached credential."""

    def __init__(self, spec: Mapping[str, Any], base_dir: str | None = None) -> None:
        command = spec.get("command")
        if not isinstance(command, str) or not command:
            raise ConfigError.from_message("kubeconfig: exec entry without a command")
        # As client-go: a command with a path separator is relative to the kubeconfig.
        if os.sep in command and not os.path.isabs(command) and base_dir:
            command = os.path.join(base_dir, command)
        self.command = command
        self.args = [str(a) for a in spec.get("args") or ()]
        self.env = {str(e.get("name")): str(e.get("value", ""))
                    for e in spec.get("env") or () if isinstance(e, Mapping)}
        self.api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
        self.mode = str(spec.get("interactiveMode") or "IfAvailable")
        self.runs = 0
        self._cred: Credential | None = None
        self._lock = asyncio.Lock()

    async def credential(self, *, force: bool = False) -> Credential:
        async with self._lock:
            if force or self._cred is None or self._cred.expired(time.time()):
                self._cred = await self._run()
            return self._cred

    async def _run(self) -> Credential:
        interactive = self.mode != "Never" and sys.stdin.isatty()
        if self.mode == "Always" and not interactive:
            raise ConfigError.from_message(f"exec plugin {self.command} needs a terminal "
                                           "(interactiveMode: Always)")
        info = {"apiVersion": self.api_version, "kind": "ExecCredential",
                "spec": {"interactive": interactive}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, *self.args, env=env, stdout=asyncio.subprocess.PIPE,
                stdin=None if interactive else asyncio.subprocess.DEVNULL)
        except OSError as exc:
            raise ConfigError.from_message(f"exec plugin {self.command}: "
                                           f"{exc.strerror or exc}") from exc
        out, _ = await proc.communicate()
        self.runs += 1
        if proc.returncode:
            raise ConfigError.from_message(f"exec plugin {self.command} exited with status "
                                           f"{proc.returncode}")
        return await asyncio.to_thread(parse_credential, out, self.command)
