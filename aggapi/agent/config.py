"""The agent's settings, from flags (and NODE_NAME from the downward API)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.kubeletconfig import DEFAULT_PATH as KUBELET_CONFIG
from aggapi.serve.site import DEFAULT_READ_HEADER_TIMEOUT
from aggapi.tls.certs import APISERVER_CLIENT_CN

CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    tls_cert: str
    tls_key: str
    client_ca: str  # aggapi's internal CA: the apiserver's client cert must chain to it
    # Capability verification key: a PEM public key or certificate file, or "" to
    # follow the apiserver replicas' published keys (token_key_set, aggapi.auth.tokenkeys).
    token_public_key: str
    host: str = "0.0.0.0"
    port: int = 10443
    allowed_client_cns: tuple[str, ...] = (APISERVER_CLIENT_CN,)
    token_issuer: str = "aggapi-apiserver"
    token_key_set: str = ""  # label value of the published key ConfigMaps to follow
    token_key_namespace: str = ""  # where they are
    # "": serve tls_cert/tls_key. Else a key made in memory, published as a CSR with this
    # label value (aggapi.auth.agentidentity); tls_cert/tls_key are then unused.
    identity_key_set: str = ""
    runtime: str = "containerd"  # "containerd" (byte progress) | "cri" (phases only)
    cri_address: str = CONTAINERD_SOCKET
    containerd_address: str = CONTAINERD_SOCKET
    containerd_namespace: str = "k8s.io"
    snapshotter: str = "overlayfs"
    poll_interval: float = 0.25
    platform: str = ""  # os/arch[/variant]; "" = this host's
    kubelet_config: str = KUBELET_CONFIG
    health_port: int = 0  # plain-HTTP /healthz, /livez, /readyz for kubelet probes; 0 = off
    # HTTPS /metrics (the serving cert, no client cert) for Prometheus; 0 = off.
    metrics_port: int = 0
    metrics_auth: str = "delegated"  # "delegated" (TokenReview + SAR) | "none"
    # While the metrics port serves, the node's pulls are followed for the pull
    # metrics (aggapi.agent.pullmetrics); one whose bytes do not move this long stalls.
    pull_stall_seconds: float = 60.0
    kubeconfig: str = ""  # for delegated metrics auth; "" = in-cluster ServiceAccount
    copy: CopyLimits = field(default_factory=CopyLimits)  # KEP-4582 quotas: --copy-* flags
    copy_as_root: bool = False  # copies act as root (docker cp), not the container's user
    log_level: str = "info"  # debug | info | warning | error
    # A request head (and the TLS handshake before it) must arrive within this time.
    read_header_timeout: float = DEFAULT_READ_HEADER_TIMEOUT
    # After SIGTERM, copies in flight may go on this long (aggapi.serve.drain); keep it
    # well inside the pod's grace period, less the preStop sleep.
    drain_timeout: float = 15.0


LOG_LEVELS = ("debug", "info", "warning", "error")
METRICS_AUTH = ("delegated", "none")
_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def byte_quantity(value: str) -> int:
    """Bytes as an integer or a Kubernetes-style quantity: 1073741824, 1Gi, 1.5G, 512Mi."""
    v = value.strip()
    mult = 1
    for suffix, m in _SUFFIXES.items():
        if v.endswith(suffix):
            v, mult = v[: -len(suffix)], m
            break
    try:
        n = float(v) if "." in v else int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte quantity: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"negative byte quantity: {value!r}")
    return int(n * mult)


def seconds(value: str) -> float:
    """A non-negative number of seconds."""
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not n >= 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be finite and >= 0: {value!r}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aggapi agent", description="aggapi node agent")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (the capability token audience); env NODE_NAME")
    p.add_argument("--certs-dir", type=Path, default=None,
                   help="directory laid out by `aggapi certs`: defaults for the four files below")
    p.add_argument("--tls-cert-file",
                   help="serving certificate (PEM; default CERTS_DIR/agent.crt)")
    p.add_argument("--tls-private-key-file",
                   help="serving key (PEM; default CERTS_DIR/agent.key)")
    p.add_argument("--client-ca-file",
                   help="CA bundle the apiserver's client certificate must chain to "
                        "(default CERTS_DIR/ca.crt)")
    p.add_argument("--token-public-key-file",
                   help="capability verification key: a PEM public key or a PEM X.509 "
                        "certificate of it (default CERTS_DIR/token-signing.pub)")
    p.add_argument("--bind-address", default="0.0.0.0",
                   help="address to serve HTTPS (and --health-port) on (default 0.0.0.0)")
    p.add_argument("--secure-port", type=int, default=10443,
                   help="HTTPS port (default 10443)")
    p.add_argument("--allowed-client-cn", action="append", default=None,
                   help=f"client certificate CN allowed to call (repeatable; default "
                        f"{APISERVER_CLIENT_CN})")
    p.add_argument("--token-issuer", default="aggapi-apiserver")
    p.add_argument("--token-key-set", default="",
                   help="follow the capability keys the apiserver replicas publish (ConfigMaps "
                        "labelled aggapi.io/token-key-set=VALUE) instead of "
                        "--token-public-key-file; needs get/list/watch on configmaps in "
                        "--token-key-namespace")
    p.add_argument("--identity-key-set", default="",
                   help="serve a key made in memory at start (no serving key file) and "
                        "publish its certificate as a CertificateSigningRequest labelled "
                        "aggapi.io/agent-identity=VALUE, which the apiservers pin to this "
                        "pod; needs create on certificatesigningrequests")
    p.add_argument("--token-key-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="namespace of the published key ConfigMaps (env POD_NAMESPACE)")
    p.add_argument("--runtime", choices=("containerd", "cri"), default="containerd",
                   help="'cri' for runtimes without a containerd content store (CRI-O)")
    p.add_argument("--cri-address", default=CONTAINERD_SOCKET,
                   help=f"CRI runtime socket (default {CONTAINERD_SOCKET})")
    p.add_argument("--containerd-address", default=CONTAINERD_SOCKET,
                   help=f"containerd socket, for byte progress (default {CONTAINERD_SOCKET})")
    p.add_argument("--containerd-namespace", default="k8s.io")
    p.add_argument("--snapshotter", default="overlayfs")
    p.add_argument("--poll-interval", type=float, default=0.25, help="seconds between polls")
    p.add_argument("--pull-stall-seconds", type=float, default=60.0,
                   help="a pull whose bytes have not moved this long counts as stalled in "
                        "aggapi_agent_image_pulls_stalled (with --metrics-port)")
    p.add_argument("--platform", default="", help="os/arch[/variant] (default: this host's)")
    p.add_argument("--kubelet-config", default=KUBELET_CONFIG,
                   help="kubelet config file (YAML or JSON) for its image-pull limits")
    p.add_argument("--health-port", type=int, default=0,
                   help="also serve plain-HTTP /healthz, /livez and /readyz on this port "
                        "(0 = off)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve /metrics over HTTPS (the serving certificate, no client "
                        "certificate) on this port, for Prometheus (0 = off)")
    p.add_argument("--metrics-auth", choices=METRICS_AUTH, default="delegated",
                   help="'delegated': a bearer token checked by TokenReview, then a "
                        "SubjectAccessReview for get on the non-resource URL /metrics "
                        "(needs system:auth-delegator); 'none': anyone who reaches the "
                        "port (local runs)")
    p.add_argument("--kubeconfig", default="",
                   help="credentials for --metrics-auth=delegated (default: the pod's "
                        "ServiceAccount)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="debug, info, warning, error (default info)")
    p.add_argument("--read-header-timeout", type=seconds, default=DEFAULT_READ_HEADER_TIMEOUT,
                   help="seconds a client has to complete the TLS handshake and then each "
                        f"request head; 0 = no limit (default {DEFAULT_READ_HEADER_TIMEOUT:g})")
    p.add_argument("--drain-timeout", type=seconds, default=AgentConfig.drain_timeout,
                   help="seconds copies in flight may go on after SIGTERM; one that cannot "
                        "finish by then ends at once with a retryable 503 (default "
                        f"{AgentConfig.drain_timeout:g})")
    p.add_argument("--body-idle-timeout", type=seconds, default=CopyLimits.body_idle_timeout,
                   help="seconds an upload may send no bytes before it is aborted (its slot "
                        "freed, its temp files removed); 0 = no limit "
                        f"(default {CopyLimits.body_idle_timeout:g})")
    c = p.add_argument_group("copy quotas (KEP-4582)")
    c.add_argument("--copy-size-limit", type=byte_quantity, default=CopyLimits.size_limit,
                   help="ContainerCopySizeLimit: bytes per copy (an integer or a quantity "
                        "such as 1Gi); larger is a 413")
    c.add_argument("--copies-per-pod", type=int, default=CopyLimits.copies_per_pod,
                   help="ContainerCopiesPerPod: concurrent copies per pod; more is a 429")
    c.add_argument("--copies-per-node", type=int, default=CopyLimits.copies_per_node,
                   help="concurrent copies on this node; more is a 429")
    c.add_argument("--copy-max-entries", type=int, default=CopyLimits.max_entries,
                   help="entries in one directory copy")
    c.add_argument("--copy-max-depth", type=int, default=CopyLimits.max_depth,
                   help="directory depth in one directory copy")
    c.add_argument("--copy-direct-io-min-size", type=byte_quantity,
                   default=CopyLimits.direct_io_min_size,
                   help="raw uploads of at least this many bytes (or of unknown length) are "
                        "written with O_DIRECT, past the node's page cache: less CPU per "
                        "byte, and a big upload does not evict the node's cached files; "
                        "0 = always through the page cache (default 4Mi)")
    # Tenant fairness (issue 24): no slot held for ever, no namespace holding them all.
    c.add_argument("--copy-namespace-share", type=float, default=CopyLimits.namespace_share,
                   help="the fraction of --copies-per-node (and of the copy worker threads) "
                        "one namespace may use at once, at least one; more is a 429; 1 = no "
                        f"per-namespace limit (default {CopyLimits.namespace_share:g})")
    c.add_argument("--copy-min-rate", type=byte_quantity, default=CopyLimits.min_rate,
                   help="bytes/s a copy's client must at least send (upload) or read "
                        "(download), averaged over --copy-rate-window seconds of waiting for "
                        "it; slower copies are aborted and free their slot; 0 = no minimum "
                        f"(default {CopyLimits.min_rate})")
    c.add_argument("--copy-rate-window", type=seconds, default=CopyLimits.rate_window,
                   help="seconds over which --copy-min-rate is averaged "
                        f"(default {CopyLimits.rate_window:g})")
    c.add_argument("--copy-state-dir", default=CopyLimits.state_dir,
                   help="where in-flight uploads are recorded, for cleanup after a crash")
    c.add_argument("--copy-as-root", action="store_true",
                   help="copies read and write as root on the node (docker cp semantics) "
                        "instead of as the container process's user; lets anyone with "
                        "pods/copy read and change every file in the container, whatever its "
                        "permissions (see docs/copy-credentials.md)")
    return p


def from_args(argv: Sequence[str]) -> AgentConfig:
    p = parser()
    a = p.parse_args(list(argv))
    d: Path | None = a.certs_dir

    def pick(value: str | None, name: str, default: str) -> str:
        if value:
            return str(value)
        if d is None:
            p.error(f"--{name} or --certs-dir is required")
        return str(d / default)

    if not a.node_name:
        p.error("--node-name (or NODE_NAME) is required")
    if a.token_key_set and a.token_public_key_file:
        p.error("--token-key-set and --token-public-key-file exclude each other")
    if a.token_key_set and not a.token_key_namespace:
        p.error("--token-key-set needs --token-key-namespace (or POD_NAMESPACE)")
    if not 0 < a.secure_port < 65536:
        p.error("--secure-port must be in 1..65535")
    if not 0 <= a.health_port < 65536:
        p.error("--health-port must be in 0..65535")
    if not 0 <= a.metrics_port < 65536:
        p.error("--metrics-port must be in 0..65535")
    if not 0 < a.copy_namespace_share <= 1:
        p.error("--copy-namespace-share must be in (0, 1]")
    return AgentConfig(
        node_name=a.node_name,
        tls_cert="" if a.identity_key_set else pick(a.tls_cert_file, "tls-cert-file",
                                                    "agent.crt"),
        tls_key="" if a.identity_key_set else pick(a.tls_private_key_file,
                                                   "tls-private-key-file", "agent.key"),
        identity_key_set=a.identity_key_set,
        client_ca=pick(a.client_ca_file, "client-ca-file", "ca.crt"),
        token_public_key="" if a.token_key_set else pick(
            a.token_public_key_file, "token-public-key-file", "token-signing.pub"),
        token_key_set=a.token_key_set, token_key_namespace=a.token_key_namespace,
        host=a.bind_address.strip("[]"), port=a.secure_port,
        allowed_client_cns=tuple(a.allowed_client_cn or (APISERVER_CLIENT_CN,)),
        token_issuer=a.token_issuer, runtime=a.runtime, cri_address=a.cri_address,
        containerd_address=a.containerd_address,
        containerd_namespace=a.containerd_namespace, snapshotter=a.snapshotter,
        poll_interval=a.poll_interval, platform=a.platform, kubelet_config=a.kubelet_config,
        health_port=a.health_port, metrics_port=a.metrics_port,
        metrics_auth=a.metrics_auth, pull_stall_seconds=a.pull_stall_seconds,
        kubeconfig=a.kubeconfig, copy_as_root=a.copy_as_root,
        log_level=a.log_level,
        read_header_timeout=a.read_header_timeout, drain_timeout=a.drain_timeout,
        copy=CopyLimits(size_limit=a.copy_size_limit, copies_per_pod=a.copies_per_pod,
                        copies_per_node=a.copies_per_node, max_entries=a.copy_max_entries,
                        max_depth=a.copy_max_depth, state_dir=a.copy_state_dir,
                        body_idle_timeout=a.body_idle_timeout,
                        direct_io_min_size=a.copy_direct_io_min_size,
                        namespace_share=a.copy_namespace_share, min_rate=a.copy_min_rate,
                        rate_window=a.copy_rate_window),
    )
