"""`aggapi apiserver`: load configuration and credentials, serve until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Sequence

from aiohttp import web

from aggapi import eventloop
from aggapi.apiserver.app import ELECTION, LIFECYCLE, build_app
from aggapi.apiserver.config import ApiServerConfig, parse_args
from aggapi.kube import client as kube
from aggapi.serve import gctune, logs
from aggapi.serve import site as serving
from aggapi.tls.serving import ServingTLS

log = logging.getLogger("aggapi.apiserver")


async def listen(app: web.Application, config: ApiServerConfig,
                 tls: ServingTLS) -> tuple[web.AppRunner, serving.TimeoutSite]:
    """Serve ``app`` on the configured address; the caller cleans the runner up."""
    # handler_cancellation: a client that goes away cancels its handler, which
    # closes the stream from the agent (the agent then drops the subscription).
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           shutdown_timeout=config.shutdown_final,
                           handler_cancellation=True,
                           keepalive_timeout=serving.KEEPALIVE_TIMEOUT,
                           read_bufsize=serving.READ_BUFSIZE)
    await runner.setup()
    # A client gets read_header_timeout for the TLS handshake and for each request
    # head: half-sent requests cannot pile up (Go's ReadHeaderTimeout).
    site = serving.TimeoutSite(runner, config.bind_address, config.secure_port,
                               ssl_context=tls.context,
                               read_header_timeout=config.read_header_timeout)
    await site.start()
    return runner, site


async def serve(config: ApiServerConfig, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tls = ServingTLS(config.tls_cert_file, config.tls_private_key_file,
                     min_version=ssl.TLSVersion.TLSv1_3 if config.tls_min_version == "1.3"
                     else ssl.TLSVersion.TLSv1_2,
                     poll_interval=config.tls_reload_interval)
    if not tls.accepts_any_client_cert:
        log.warning("client certificates are verified in the TLS handshake "
                    "(libssl callback unavailable): untrusted certs fail the handshake")
    api = await kube.load_client(config.kubeconfig or None)
    try:
        app = build_app(config, kube_api=api, tls=tls, on_warm=gctune.freeze)
        runner, _site = await listen(app, config, tls)
        log.info("serving", extra={"address": config.bind_address, "port": config.secure_port})
        await stop.wait()
        # Not ready (and progress streams told to resume elsewhere) at once, but still
        # accepting for a while: kube-apiserver keeps sending requests here until the
        # EndpointSlice without this replica reaches it; a closed port would fail them.
        app[LIFECYCLE].draining.set()
        log.info("shutting down", extra={"delaySeconds": config.shutdown_delay})
        await hand_over(app, config)
        await runner.cleanup()
    finally:
        await api.close()


async def hand_over(app: web.Application, config: ApiServerConfig) -> None:
    """The shutdown delay and, beside it, the hand-over of the collections (a follower
    warms its term while this replica leads on, election.py), then the Lease handed:
    both while still accepting (the followers forward here until then). What the
    hand-over outlasts the delay by is taken from the drain."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    election = app[ELECTION]
    await asyncio.gather(asyncio.sleep(config.shutdown_delay),
                         election.hand_over(config.handover_timeout))
    await election.release()
    app[LIFECYCLE].grace_spent = max(0.0, loop.time() - start - config.shutdown_delay)


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    logs.configure(config.log_level)
    gctune.tune()
    if not config.tls_cert_file or not config.tls_private_key_file:
        log.error("--tls-cert-file and --tls-private-key-file are required")
        return 2
    try:
        eventloop.run(serve(config))
    except kube.KubeConfigError as exc:  # a clear line, not a traceback, for operators
        log.error("cannot use the Kubernetes client configuration: %s", exc)
        return 1
    return 0
