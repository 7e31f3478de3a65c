"""Authorized GET throughput and SubjectAccessReview count for identical requests.

Starts a fake kube-apiserver (allows every SAR, counts them) and the apiserver on
127.0.0.1 with freshly minted certificates, then sends N identical front-proxy
requests (front-proxy client cert + X-Remote-* headers) for
pods/imagepullprogress, through authentication and authorization to the handler.
Goal: <= 1 SAR per 10 s per identical attributes.

    python3 -m benchmarks.bench_authz [--requests 1000] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from aggapi.apiserver.app import new_app
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.parts import complete
from aggapi.tls import pki
from aggapi.tls.serving import ServingTLS
from tests.framework.fakekube import FakeKube

PATH = "/apis/subresources.aggapi.io/v1alpha1/namespaces/bench/pods/web-0/imagepullprogress"


async def run(requests: int, concurrency: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-authz-"))
    serving_ca, client_ca, fp_ca = (pki.new_ca(n) for n in ("serving", "client", "front-proxy"))
    serving_ca.write(tmp / "ca.crt", tmp / "ca.key")
    pki.issue(serving_ca, "aggapi", ips=["127.0.0.1"], server=True).write(
        tmp / "tls.crt", tmp / "tls.key")
    pki.issue(fp_ca, "front-proxy-client", client=True).write(tmp / "fp.crt", tmp / "fp.key")

    kube = FakeKube()
    kube.sar_policy = lambda _spec: True
    kube.put("api/v1", "configmaps", {"metadata": {
        "name": "extension-apiserver-authentication", "namespace": "kube-system"}, "data": {
        "client-ca-file": client_ca.cert_pem.decode(),
        "requestheader-client-ca-file": fp_ca.cert_pem.decode(),
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"])}})
    await kube.start()
    api = kube.kube_client()
    cfg = ApiServerConfig(bind_address="127.0.0.1", secure_port=0,
                          tls_cert_file=str(tmp / "tls.crt"),
                          tls_private_key_file=str(tmp / "tls.key"))
    tls = ServingTLS(cfg.tls_cert_file, cfg.tls_private_key_file)
    parts = complete(cfg, kube_api=api, tls=tls)
    app = new_app(parts)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await asyncio.wait_for(parts.auth_source.ready.wait(), 10)

    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    ctx.load_cert_chain(str(tmp / "fp.crt"), str(tmp / "fp.key"))
    headers = {"X-Remote-User": "alice", "X-Remote-Group": "devs"}
    codes: dict[int, int] = {}
    try:
        async with aiohttp.ClientSession(
                f"https://127.0.0.1:{port}",
                connector=aiohttp.TCPConnector(ssl=ctx, limit=concurrency)) as sess:
            async def one() -> None:
                async with sess.get(PATH, headers=headers) as resp:
                    await resp.read()
                    codes[resp.status] = codes.get(resp.status, 0) + 1

            await one()  # warm-up: TLS handshake, first (uncached) SAR
            queue = iter(range(requests))

            async def worker() -> None:
                for _ in queue:
                    await one()
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - start
    finally:
        await runner.cleanup()
        await api.close()
        await kube.stop()
    metrics = parts.metrics
    return {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "requests_per_second": round(requests / elapsed, 1),
        "sar_calls_total": len(kube.sar_calls),
        "authz_cache_hits": metrics.value("aggapi_apiserver_authorization_cache_total",
                                          result="hit"),
        "status_codes": codes,  # type: ignore[dict-item]
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=10)
    a = p.parse_args()
    result = asyncio.run(run(a.requests, a.concurrency))
    for key, value in result.items():
        print(f"{key:>22}: {value}")
    print(f"{'goal':>22}: <= 1 SAR per 10 s per identical attributes -> "
          f"{'met' if result['sar_calls_total'] <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
