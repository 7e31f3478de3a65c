"""`aggapi agent`: serve the node agent until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Sequence

from aiohttp import web

from aggapi import eventloop
from aggapi.agent.app import build_app, build_health_app, build_metrics_app, connect
from aggapi.agent.auth import server_context, serving_context
from aggapi.agent.config import AgentConfig, from_args
from aggapi.auth.agentidentity import new_identity
from aggapi.serve import logs
from aggapi.serve import site as serving

log = logging.getLogger(__name__)

# Seconds the last requests (progress streams) get once the copies have drained.
SHUTDOWN_FINAL = 2.0


async def listen(app: web.Application, config: AgentConfig, port: int,
                 tls: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve ``app`` on ``port``; the caller cleans the runner up."""
    # handler_cancellation: when the apiserver drops a stream (its client left),
    # the handler is cancelled at once, which ends the poller subscription or
    # aborts the copy (its temp file removed) instead of waiting for a write to fail.
    # shutdown_timeout: by the time the runner is cleaned up the copies have drained
    # (serve); what is left (progress streams) is cancelled soon, well inside the pod's
    # grace period, so their clients resume elsewhere.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_FINAL,
                           keepalive_timeout=serving.KEEPALIVE_TIMEOUT,
                           read_bufsize=serving.READ_BUFSIZE)
    await runner.setup()
    # read_header_timeout bounds the TLS handshake and each request head (Go's
    # ReadHeaderTimeout); upload bodies are bounded by --body-idle-timeout.
    await serving.TimeoutSite(runner, config.host, port, ssl_context=tls,
                              read_header_timeout=config.read_header_timeout).start()
    return runner


async def serve(config: AgentConfig, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    identity = None
    if config.identity_key_set:
        # No serving key at rest: made here, published (as a CSR) for the apiservers.
        identity = await asyncio.to_thread(new_identity, config.node_name)
        tls = await asyncio.to_thread(identity.server_context, config.client_ca)
    else:
        tls = await asyncio.to_thread(server_context, config.tls_cert, config.tls_key,
                                      config.client_ca)
    parts = await connect(config, identity)
    runners: list[web.AppRunner] = []
    try:
        runners.append(await listen(build_app(parts), config, config.port, tls))
        if config.health_port:
            runners.append(await listen(build_health_app(parts), config, config.health_port))
        if config.metrics_port:
            # Prometheus has no client certificate from aggapi's CA: server TLS only,
            # each scrape authorized by its bearer token (see build_metrics_app).
            plain_tls = await asyncio.to_thread(
                identity.server_context if identity is not None else
                (lambda: serving_context(config.tls_cert, config.tls_key)))
            runners.append(await listen(build_metrics_app(parts), config,
                                        config.metrics_port, plain_tls))
        log.info("agent serving", extra={"node": config.node_name, "port": config.port,
                                         "metrics_port": config.metrics_port,
                                         "runtime": config.runtime})
        await stop.wait()
        # SIGTERM: readiness fails and new copies get a retryable 503 at once; copies in
        # flight finish if they can before the drain deadline, else end now with a 503.
        t0 = loop.time()
        parts.drain.start(config.drain_timeout)
        await parts.drain.idle()
        log.info("copies drained", extra={"seconds": round(loop.time() - t0, 3),
                                          "endedEarly": parts.drain.ended_early})
    finally:
        for r in reversed(runners):
            await r.cleanup()
        await parts.close_clients()
        log.info("agent stopped")


def main(argv: Sequence[str]) -> int:
    config = from_args(argv)
    logs.configure(config.log_level)
    eventloop.run(serve(config))
    return 0
