"""The apiserver's parts, built once from its configuration ("Complete" in the
generic apiserver's ``Config -> Complete() -> New()``).

Every long-lived object the server needs is made here and nowhere else; the app
(``app.py``) then hands each middleware and handler exactly the parts it uses,
at construction. Tests build their own ``Parts`` (fakes included) the same way.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentDirectory
from aggapi.apiserver.authconfig import AuthConfig, AuthConfigSource, parse_certs
from aggapi.apiserver.authn import ANONYMOUS_PATHS, Authenticator
from aggapi.apiserver.authz import Authorizer
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.fleet import FleetMetrics
from aggapi.apiserver.collections.linkhold import LinkHold
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.election import Election, LeaseElection
from aggapi.apiserver.imagepullprogress.fanout import SharedStreams
from aggapi.apiserver.imagepullprogress.objects import new_progress_streams
from aggapi.apiserver.imagepullprogress.podwatch import PodWatchHub
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.mirror import Mirror, succession, term_listener
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.replicas import Forwarder, cert_sha256
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.auth.agentidentity import IdentityPins
from aggapi.auth.capability import CapabilitySigner
from aggapi.auth.delegated import TokenReviewer
from aggapi.auth.tokenkeys import KeyPublisher
from aggapi.kube.client import KubeClient
from aggapi.tls.serving import ServingTLS

log = logging.getLogger(__name__)


@dataclass
class Parts:
    config: ApiServerConfig
    kube_api: KubeClient  # the caller's to close
    metrics: Metrics
    auth_source: AuthConfigSource
    authenticator: Authenticator
    authorizer: Authorizer
    lifecycle: Lifecycle  # draining / shutdown events and the in-flight stream count
    tls: ServingTLS | None  # None when served without TLS (unit tests)
    agent: AgentClient | None  # None when not configured: the subresources answer 503
    pod_watches: PodWatchHub  # progress streams' pods, read from feeds.sources
    progress_streams: SharedStreams  # progress producers shared by identical requests
    feeds: Feeds  # podimagepulls/nodeimagepulls: shared pod/event watches and node polls
    election: Election  # which replica computes the collections (standalone: this one)
    forwarder: Forwarder | None  # to the leader, while another replica leads
    fleet: FleetMetrics  # the leader's fleet gauges, set at each scrape (--fleet-metrics)
    link_hold: LinkHold  # the leader's node feed held for link peers (--link-peers)
    mirror: Mirror | None = None  # the leader's podimagepulls, kept while following


def _signer(config: ApiServerConfig, kube_api: KubeClient
            ) -> tuple[CapabilitySigner, KeyPublisher | None]:
    if config.token_signing_key_file:
        return CapabilitySigner(Path(config.token_signing_key_file).read_bytes()), None
    # No private key at rest: made here, gone with the process; only the public half
    # is published, for the agents.
    if not (config.token_key_set and config.pod_namespace and config.pod_name
            and config.pod_uid):
        raise SystemExit("without --token-signing-key-file, --token-key-set, "
                         "--pod-namespace, --pod-name and --pod-uid are required "
                         "(the in-memory key's public half is published for the agents)")
    signer = CapabilitySigner.generate()
    return signer, KeyPublisher(kube_api, signer, namespace=config.pod_namespace,
                                pod_name=config.pod_name, pod_uid=config.pod_uid,
                                key_set=config.token_key_set)


def _agent_client(config: ApiServerConfig, kube_api: KubeClient) -> AgentClient | None:
    files = (config.agent_ca_file, config.agent_client_cert_file,
             config.agent_client_key_file)
    if not all(files):
        if any(files) or config.token_signing_key_file:
            raise SystemExit("--agent-ca-file, --agent-client-cert-file and "
                             "--agent-client-key-file go together (and with "
                             "--token-signing-key-file, if given)")
        log.warning("no agent credentials configured: the subresources will answer 503")
        return None
    directory = AgentDirectory(kube_api, namespace=config.agent_namespace,
                               service=config.agent_service, port_name=config.agent_port_name,
                               daemonset=config.agent_daemonset,
                               pod_check=config.agent_pod_check)
    signer, publisher = _signer(config, kube_api)
    pins = None
    if config.agent_identity_key_set:
        if not config.agent_pod_check:
            raise SystemExit("--agent-identity-key-set needs --agent-pod-check (the pin is "
                             "per agent pod)")
        pins = IdentityPins(kube_api, key_set=config.agent_identity_key_set,
                            namespace=config.agent_namespace,
                            service_account=config.agent_service_account
                            or config.agent_service,
                            client_cert=config.agent_client_cert_file,
                            client_key=config.agent_client_key_file)
    return AgentClient(directory, signer, ca_file=config.agent_ca_file,
                       cert_file=config.agent_client_cert_file,
                       key_file=config.agent_client_key_file, key_publisher=publisher,
                       pins=pins)


def _election(config: ApiServerConfig, kube_api: KubeClient, feeds: Feeds,
              lifecycle: Lifecycle, on_synced: Callable[[], None] | None = None
              ) -> tuple[Election, Forwarder | None, Mirror | None]:
    """Standalone, or a Lease election whose changes start a new term of the feeds
    (from this replica's mirror of the last leader's, mirror.py)."""
    if not config.leader_elect:
        return Election(), None, None
    identity = f"{config.pod_name}_{uuid.uuid4().hex[:8]}"
    host = config.advertise_address
    election = LeaseElection(
        kube_api, namespace=config.pod_namespace, name=config.leader_elect_lease,
        identity=identity,
        endpoint=f"https://{f'[{host}]' if ':' in host else host}:{config.secure_port}",
        cert_sha256=lambda: cert_sha256(config.tls_cert_file))

    forwarder = Forwarder(election, kube_api.bearer_token, identity, lifecycle)
    mirror = Mirror(forwarder, election, on_synced)
    election.listeners.insert(0, term_listener(election, feeds, mirror))
    election.succession = succession(feeds, mirror)
    return election, forwarder, mirror


def complete(config: ApiServerConfig, *, kube_api: KubeClient, tls: ServingTLS | None = None,
             auth_source: AuthConfigSource | None = None,
             on_warm: Callable[[], None] | None = None) -> Parts:
    """Every part of the server, from its configuration."""
    metrics = Metrics()
    source = auth_source or AuthConfigSource(kube_api, config.auth_configmap_namespace,
                                             config.auth_configmap_name)
    extra_pem = Path(config.client_ca_file).read_bytes() if config.client_ca_file else b""
    extra_cas = parse_certs(extra_pem, config.client_ca_file) if config.client_ca_file else ()
    tokens = TokenReviewer(kube_api, metrics, ttl=config.authn_cache_ttl,
                           maxsize=config.authn_cache_size, timeout=config.review_timeout)
    if tls is not None:
        async def _cas_changed(cfg: AuthConfig) -> None:
            # Only used when the handshake itself must verify (no libssl callback).
            await tls.set_client_cas([cfg.client_ca_pem, cfg.requestheader_ca_pem, extra_pem])

        source.subscribe(_cas_changed)
    agent = _agent_client(config, kube_api)
    feeds = Feeds(Sources(kube_api, linger=config.collection_linger), agent,
                  linger=config.collection_linger,
                  poll_interval=config.collection_poll_interval,
                  polls_per_second=config.collection_polls_per_second,
                  warm=config.collection_warm, on_warm=on_warm)
    metrics.collection_watches.set_function(feeds.watches)
    lifecycle = Lifecycle(metrics)
    def mirrored() -> None:  # a follower's mirror synced: its replica is complete too
        feeds.built.set()
        if on_warm is not None:
            on_warm()

    election, forwarder, mirror = _election(config, kube_api, feeds, lifecycle, mirrored)
    metrics.collection_node_polls.set_function(feeds.agent_polls)
    return Parts(
        config=config, kube_api=kube_api, metrics=metrics, auth_source=source,
        authenticator=Authenticator(source, tokens, metrics,
                                    anonymous_enabled=config.anonymous_auth,
                                    anonymous_paths=ANONYMOUS_PATHS | (
                                        {"/metrics"} if config.always_allow_metrics
                                        else set()),
                                    extra_client_cas=extra_cas),
        authorizer=Authorizer(kube_api, metrics, allow_ttl=config.authz_allow_ttl,
                              deny_ttl=config.authz_deny_ttl, maxsize=config.authz_cache_size,
                              timeout=config.review_timeout),
        lifecycle=lifecycle, tls=tls, agent=agent,
        pod_watches=PodWatchHub(feeds.sources), progress_streams=new_progress_streams(),
        feeds=feeds, election=election, forwarder=forwarder, mirror=mirror,
        fleet=FleetMetrics(metrics, feeds, election, enabled=config.fleet_metrics),
        link_hold=LinkHold(feeds, election, enabled=config.link_peers))
