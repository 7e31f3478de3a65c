"""Where and how to reach the Kubernetes API: kubeconfig files and in-cluster credentials.

Produces a :class:`ClusterConfig` (server URL, TLS context, bearer token or token
file) for :class:`aggapi.kube.client.KubeClient`. Only the credentials aggapi is run with
are supported: CA and client certificates (files or inline data), static tokens and
token files. Exec plugins and auth-provider entries fail with a clear error instead
of a confusing 401 later, unless the caller runs exec plugins itself (the kubectl
plugins do, through :mod:`aggapi.client.execcred`) and asks for their spec.
Everything here does blocking file I/O: call it from a thread when a loop is running.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Mounted by kubelet into every pod with a service account; a module constant so
# tests can point it elsewhere.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeConfigError(Exception):
    """The kubeconfig or in-cluster environment cannot be used."""


@dataclass(frozen=True)
class ClusterConfig:
    server: str
    ssl_context: ssl.SSLContext | None = None  # None: plain http:// server
    token: str | None = None
    token_file: str | None = None  # re-read when it changes (rotating tokens)
    tls_server_name: str | None = None
    namespace: str | None = None  # the context's default namespace
    exec_spec: Mapping[str, Any] | None = None  # only with load_kubeconfig(allow_exec=True)
    base_dir: str | None = None  # the kubeconfig's directory (relative exec commands)


def in_cluster() -> bool:
    """True inside a pod (the kubelet-injected service environment is present)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def ssl_context(*, ca_file: str | None = None, ca_data: str | None = None,
                cert_file: str | None = None, key_file: str | None = None,
                cert_data: bytes | None = None, key_data: bytes | None = None,
                verify: bool = True) -> ssl.SSLContext:
    """A client TLS context; without a CA the system trust store is used, unless
    nothing is verified (then no store is read: 25 ms of a plugin's start-up)."""
    if verify or ca_file or ca_data:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file,
                                         cadata=ca_data)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    elif cert_data:
        load_chain_from_memory(ctx, cert_data, key_data or b"")
    return ctx


def load_chain_from_memory(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # The ssl module loads certificates only from files: use a private (0600) temp
    # file that exists just for the duration of the call.
    fd, path = tempfile.mkstemp(prefix="aggapi-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cert.rstrip(b"\n") + b"\n" + key)
        ctx.load_cert_chain(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def load_incluster() -> ClusterConfig:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set "
                              "for in-cluster configuration")
    sa = Path(SERVICE_ACCOUNT_DIR)
    token_file, ca_file = sa / "token", sa / "ca.crt"
    for f in (token_file, ca_file):
        if not f.is_file():
            raise KubeConfigError(f"in-cluster configuration: {f} does not exist")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return ClusterConfig(server=f"https://{host}:{port}",
                         ssl_context=ssl_context(ca_file=str(ca_file)),
                         token_file=str(token_file))


def default_kubeconfig_path() -> str:
    """The first entry of $KUBECONFIG, else ~/.kube/config."""
    for entry in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        if entry.strip():
            return entry.strip()
    return str(Path.home() / ".kube" / "config")


def _named(doc: Mapping[str, Any], section: str, name: str, field: str) -> Mapping[str, Any]:
    for entry in doc.get(section) or ():
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(field) or {}
            if not isinstance(value, Mapping):
                raise KubeConfigError(f"kubeconfig: {section} entry {name!r} is malformed")
            return value
    raise KubeConfigError(f"kubeconfig: no {field} named {name!r}")


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeConfigError(f"kubeconfig: {what} is not valid base64") from exc


def parse_document(text: str) -> Any:
    """A kubeconfig's content; ValueError when it is neither JSON nor YAML.

    JSON (what many tools write, hack/local-up.sh too) is YAML, but json parses it
    without importing yaml: 10 to 15 ms less of a kubectl plugin's start-up. YAML goes
    to libyaml's loader when PyYAML has it (ten times the pure-Python one's speed)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # a YAML flow mapping, or broken: YAML's parser says which
    import yaml  # only YAML kubeconfigs pay for it; in-cluster never does

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


def load_kubeconfig(path: str | None = None, context: str | None = None, *,
                    allow_exec: bool = False, cluster_name: str | None = None,
                    user_name: str | None = None,
                    cluster_overrides: Mapping[str, Any] | None = None,
                    user_overrides: Mapping[str, Any] | None = None) -> ClusterConfig:
    """The cluster and credentials of ``context`` (default: current-context); with
    ``allow_exec`` an exec-plugin user comes back with its ``exec_spec`` to run.

    ``cluster_name``/``user_name`` replace the context's (kubectl's --cluster and
    --user); the overrides are kubeconfig fields laid over the chosen entries
    (kubectl's --server, --token, ...); file paths in them should be absolute."""
    path = path or default_kubeconfig_path()
    try:
        doc = parse_document(Path(path).read_text())
    except OSError as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    except ValueError as exc:
        raise KubeConfigError(f"cannot parse kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise KubeConfigError(f"kubeconfig {path} is not a mapping")
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise KubeConfigError(f"kubeconfig {path}: no context given and no current-context")
    ctx = _named(doc, "contexts", ctx_name, "context")
    ctx = {**ctx, **{k: v for k, v in (("cluster", cluster_name), ("user", user_name)) if v}}
    cluster = {**_named(doc, "clusters", ctx.get("cluster") or "", "cluster"),
               **(cluster_overrides or {})}
    user = {**(_named(doc, "users", ctx["user"], "user") if ctx.get("user") else {}),
            **(user_overrides or {})}
    # Relative file references are relative to the kubeconfig's directory.
    base = Path(path).resolve().parent

    def file(value: Any) -> str:
        return str(base / os.path.expanduser(str(value)))

    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no "
                              "http(s) server")
    exec_spec = user.get("exec") if allow_exec else None
    if exec_spec is not None and not isinstance(exec_spec, Mapping):
        raise KubeConfigError(f"kubeconfig {path}: user {ctx.get('user')!r} has a malformed "
                              "exec entry")
    for key, what in (("exec", "exec credential plugins"),
                      ("auth-provider", "auth-provider plugins"),
                      ("username", "basic authentication")):
        if user.get(key) and not (key == "exec" and exec_spec is not None):
            raise KubeConfigError(f"kubeconfig {path}: user {ctx.get('user')!r} uses {what}, "
                                  "which aggapi does not support; use a token, token file "
                                  "or client certificate")
    if cluster.get("proxy-url"):
        raise KubeConfigError(f"kubeconfig {path}: proxy-url is not supported")

    tls: ssl.SSLContext | None = None
    if server.startswith("https://"):
        ca_data = cluster.get("certificate-authority-data")
        ca_file = cluster.get("certificate-authority")
        cert_file, key_file = user.get("client-certificate"), user.get("client-key")
        cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
        try:
            tls = ssl_context(
                ca_data=_b64(ca_data, "certificate-authority-data").decode() if ca_data
                else None,
                ca_file=file(ca_file) if ca_file and not ca_data else None,
                cert_file=file(cert_file) if cert_file and not cert_data else None,
                key_file=file(key_file) if key_file and not key_data else None,
                cert_data=_b64(cert_data, "client-certificate-data") if cert_data else None,
                key_data=_b64(key_data, "client-key-data") if key_data else None,
                verify=not cluster.get("insecure-skip-tls-verify"))
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(f"kubeconfig {path}: TLS credentials: {exc}") from exc
    token_file = user.get("tokenFile")
    return ClusterConfig(server=server, ssl_context=tls,
                         token=str(user["token"]) if user.get("token") else None,
                         token_file=file(token_file) if token_file else None,
                         tls_server_name=cluster.get("tls-server-name") or None,
                         namespace=str(ctx.get("namespace") or "") or None,
                         exec_spec=exec_spec, base_dir=str(base))


def load(kubeconfig: str | None = None, context: str | None = None) -> ClusterConfig:
    """``kubeconfig`` if given, else in-cluster credentials in a pod, else the default
    kubeconfig ($KUBECONFIG, ~/.kube/config)."""
    if not kubeconfig and in_cluster():
        return load_incluster()
    return load_kubeconfig(kubeconfig, context)
