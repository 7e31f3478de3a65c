"""`aggapi apiserver` configuration: flags, each with an AGGAPI_* environment fallback."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aggapi.serve.site import DEFAULT_READ_HEADER_TIMEOUT


@dataclass
class ApiServerConfig:
    bind_address: str = "0.0.0.0"
    secure_port: int = 8443
    tls_cert_file: str = ""
    tls_private_key_file: str = ""
    tls_min_version: str = "1.2"
    tls_reload_interval: float = 1.0
    # Extra client CA next to the ConfigMap's client-ca-file (e.g. for Prometheus).
    client_ca_file: str = ""
    kubeconfig: str = ""
    auth_configmap_namespace: str = "kube-system"
    auth_configmap_name: str = "extension-apiserver-authentication"
    anonymous_auth: bool = True
    authn_cache_ttl: float = 10.0
    authz_allow_ttl: float = 10.0
    authz_deny_ttl: float = 10.0
    authz_cache_size: int = 10000
    authn_cache_size: int = 10000
    review_timeout: float = 5.0
    always_allow_metrics: bool = False
    shutdown_delay: float = 0.0
    shutdown_grace: float = 30.0
    shutdown_final: float = 5.0
    handover_timeout: float = 25.0
    log_level: str = "info"
    # Node agents: found through the EndpointSlices of their Service, called over mTLS
    # with a capability token signed by this key.
    agent_namespace: str = "aggapi"
    agent_service: str = "aggapi-agent"
    agent_port_name: str = "https"
    # Use only EndpointSlice entries that are the agent DaemonSet's pod on their node.
    agent_pod_check: bool = True
    agent_daemonset: str = ""  # "" = --agent-service's name
    # "": trust agents whose serving cert chains to agent_ca_file. Else pin each agent
    # pod to the certificate it published (a CSR with this label value).
    agent_identity_key_set: str = ""
    agent_service_account: str = ""  # "" = --agent-service's name
    agent_ca_file: str = ""
    agent_client_cert_file: str = ""
    agent_client_key_file: str = ""
    # Empty: a key pair made in memory at start, its public half published as a
    # ConfigMap owned by this pod (aggapi.auth.tokenkeys); needs the four fields below.
    token_signing_key_file: str = ""
    token_key_set: str = ""
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    # pods/imagepullprogress on the plain (non-/watch/) path ends cleanly before
    # kube-apiserver's --request-timeout (60 s) would cut it mid-line.
    stream_deadline: float = 55.0
    # Every pods/copy operation (download, stat, upload) also needs `create` on core
    # pods/exec.
    copy_require_exec: bool = True
    # A request head (and the TLS handshake before it) must arrive within this time.
    read_header_timeout: float = DEFAULT_READ_HEADER_TIMEOUT
    # podimagepulls/nodeimagepulls: their pod and event watches (and node polls) stay
    # this long after the last request, so a list then a watch finds them warm.
    collection_linger: float = 30.0
    # The leader keeps the cluster-wide podimagepulls feed (its pod and event watches and
    # the objects) from the start of its term, so a first list never waits for a cold
    # build (~6 s at 10,000 pods, most of it kube-apiserver's own lists and decoding).
    collection_warm: bool = True
    # Seconds between reads of a node's pulls from its agent while a collection
    # follows a pod there.
    collection_poll_interval: float = 1.0
    # At most this many node reads per second in all (0: no bound): with more nodes
    # pulling, each is read less often (5,000 nodes: every 10 s).
    collection_polls_per_second: float = 500.0
    # The leader's /metrics carries the fleet's pulls per registry host: each scrape
    # uses the nodeimagepulls collection (every node's view polled while scraped).
    fleet_metrics: bool = False
    # The leader tells nodes pulling over one shared link each other's pulls, for
    # their ETAs: it keeps the nodeimagepulls collection running while it leads.
    link_peers: bool = False
    # More than one replica: one computes the collections (elected with this Lease in
    # --pod-namespace), the others forward to it at the address it advertises.
    leader_elect: bool = False
    leader_elect_lease: str = "aggapi-collections"
    advertise_address: str = ""


# flag name -> (type, help); the env name is AGGAPI_<FLAG_WITH_UNDERSCORES>.
_FLAGS: dict[str, tuple[type, str]] = {
    "bind-address": (str, "address to listen on"),
    "leader-elect": (bool, "elect one replica (a coordination.k8s.io Lease in "
                           "--pod-namespace) to compute podimagepulls/nodeimagepulls; "
                           "the others forward to it"),
    "leader-elect-lease": (str, "the Lease's name"),
    "advertise-address": (str, "this replica's IP, for the others to forward to"),
    "secure-port": (int, "HTTPS port"),
    "tls-cert-file": (str, "serving certificate (PEM), reloaded when it changes"),
    "tls-private-key-file": (str, "serving key (PEM), reloaded when it changes"),
    "tls-min-version": (str, "minimum TLS version: 1.2 or 1.3"),
    "tls-reload-interval": (float, "seconds between checks of the serving files"),
    "client-ca-file": (str, "extra CA bundle for client-certificate authentication"),
    "kubeconfig": (str, "kubeconfig; empty: in-cluster credentials or the default"),
    "auth-configmap-namespace": (str, "namespace of the authentication ConfigMap"),
    "auth-configmap-name": (str, "name of the authentication ConfigMap"),
    "anonymous-auth": (bool, "let unauthenticated requests to the health paths (and /metrics "
                       "with --always-allow-metrics) through as system:anonymous; "
                       "anywhere else they are a 401"),
    "authn-cache-ttl": (float, "seconds a TokenReview result is cached"),
    "authz-allow-ttl": (float, "seconds an allowed SubjectAccessReview is cached"),
    "authz-deny-ttl": (float, "seconds a denied SubjectAccessReview is cached"),
    "authz-cache-size": (int, "max cached authorization decisions"),
    "authn-cache-size": (int, "max cached token reviews"),
    "review-timeout": (float, "seconds to wait for a TokenReview/SubjectAccessReview"),
    "always-allow-metrics": (bool, "serve /metrics without authorization"),
    "shutdown-delay": (float, "seconds to keep accepting requests after SIGTERM, not ready, "
                       "while endpoints drop this replica (progress streams end at once)"),
    "shutdown-grace": (float, "seconds streams may run on after SIGTERM"),
    "shutdown-final": (float, "seconds streams get to end after being told to"),
    "handover-timeout": (float, "seconds a leader shutting down leads on, serving, while a "
                         "follower warms its term (informers listed, objects built), "
                         "before it hands the Lease over (beside --shutdown-delay; what "
                         "outlasts it is taken from --shutdown-grace). 0: release at once"),
    "log-level": (str, "debug, info, warning, error"),
    "agent-namespace": (str, "namespace of the agent Service"),
    "agent-service": (str, "name of the agent Service (its EndpointSlices carry nodeName)"),
    "agent-port-name": (str, "name of the agent's HTTPS port in the EndpointSlices"),
    "agent-pod-check": (bool, "use an EndpointSlice entry only when its targetRef is a pod "
                              "controlled by the agent DaemonSet, on that node, with that "
                              "address (off: agents that run outside pods)"),
    "agent-daemonset": (str, "name of the agent DaemonSet (default: --agent-service)"),
    "agent-identity-key-set": (str, "trust each agent pod only with the certificate it "
                                    "published (CSRs labelled aggapi.io/agent-identity="
                                    "VALUE, made with its pod's token); needs "
                                    "--agent-pod-check"),
    "agent-service-account": (str, "the agents' ServiceAccount, whose CSRs count "
                                   "(default: --agent-service)"),
    "agent-ca-file": (str, "CA bundle that signs the agents' serving certificates"),
    "agent-client-cert-file": (str, "client certificate presented to agents (mTLS)"),
    "agent-client-key-file": (str, "key of --agent-client-cert-file"),
    "token-signing-key-file": (str, "ES256/Ed25519 private key for agent capability tokens; "
                               "empty: a key made in memory at start, its public key "
                               "published as a ConfigMap (needs --token-key-set and "
                               "--pod-namespace/--pod-name/--pod-uid)"),
    "token-key-set": (str, "label value (aggapi.io/token-key-set) of the published key "
                           "ConfigMap; the agents watch this set"),
    "pod-namespace": (str, "this replica's namespace, where its key ConfigMap goes"),
    "pod-name": (str, "this replica's pod name (the downward API)"),
    "pod-uid": (str, "this replica's pod uid: the key ConfigMap's owner"),
    "stream-deadline": (float, "seconds after which a stream on the plain path ends "
                               "cleanly (kube-apiserver cuts non-watch requests at 60 s)"),
    "copy-require-exec": (bool, "copies (download, stat, upload) also require create on "
                                "core pods/exec"),
    "read-header-timeout": (float, "seconds a client has to complete the TLS handshake "
                                   "and then each request head; 0 = no limit"),
    "collection-linger": (float, "seconds the collections' pod/event watches and node "
                                 "polls outlive their last request"),
    "collection-warm": (bool, "the leader keeps the cluster-wide podimagepulls feed (one "
                              "pod and one event watch, every pod's object) for its whole "
                              "term, not only while requests use it"),
    "collection-poll-interval": (float, "seconds between reads of a node's pulls while "
                                        "a collection follows a pod there"),
    "collection-polls-per-second": (float, "node reads per second at most, all nodes "
                                           "together: beyond it each node is read less "
                                           "often than --collection-poll-interval "
                                           "(0 = no bound)"),
    "fleet-metrics": (bool, "the leader's /metrics carries the fleet's image pulls per "
                            "registry host, from the collections (each scrape keeps every "
                            "node's view polled)"),
    "link-peers": (bool, "the leader tells nodes that pull over one shared link (judged "
                         "per registry host) each other's pulls, for their ETAs; it keeps "
                         "every node's view polled while it leads"),
}


def _env_name(flag: str) -> str:
    return "AGGAPI_" + flag.upper().replace("-", "_")


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if env is None else env
    defaults = ApiServerConfig()
    p = argparse.ArgumentParser(prog="aggapi apiserver",
                                description="serve subresources.aggapi.io/v1alpha1")
    for flag, (typ, text) in _FLAGS.items():
        attr = flag.replace("-", "_")
        default = getattr(defaults, attr)
        raw = env.get(_env_name(flag))
        if raw is not None:
            default = _bool(raw) if typ is bool else typ(raw)
        conv = _bool if typ is bool else typ
        p.add_argument(f"--{flag}", dest=attr, type=conv, default=default,
                       nargs="?" if typ is bool else None, const=True if typ is bool else None,
                       help=f"{text} (env {_env_name(flag)}, default {default!r})")
    return p


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ApiServerConfig:
    ns = parser(env).parse_args(list(argv))
    cfg = ApiServerConfig(**vars(ns))
    if cfg.tls_min_version not in ("1.2", "1.3"):
        raise SystemExit("--tls-min-version must be 1.2 or 1.3")
    if cfg.read_header_timeout < 0:
        raise SystemExit("--read-header-timeout must not be negative")
    if cfg.leader_elect and not (cfg.pod_namespace and cfg.pod_name
                                 and cfg.advertise_address and cfg.tls_cert_file):
        raise SystemExit("--leader-elect needs --pod-namespace, --pod-name, "
                         "--advertise-address and --tls-cert-file")
    return cfg
