"""kubernetes_asyncio ApiClient construction: kubeconfig, in-cluster, or a plain URL."""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config


async def load_client(kubeconfig: str | None = None, *, context: str | None = None,
                      ) -> client.ApiClient:
    """A client from ``kubeconfig`` if given, else in-cluster service-account
    credentials when running in a pod, else the default kubeconfig ($KUBECONFIG,
    ~/.kube/config). The caller closes it."""
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(configuration=cfg)
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, context=context,
                                  client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


def client_for_url(url: str, *, token: str | None = None, ca_file: str | None = None,
                   cert_file: str | None = None, key_file: str | None = None,
                   verify: bool = True) -> client.ApiClient:
    """A client for an explicit endpoint (tests, fake kube-apiserver, harness)."""
    cfg = client.Configuration(host=url.rstrip("/"))
    if token:
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.ssl_ca_cert = ca_file
    cfg.cert_file = cert_file
    cfg.key_file = key_file
    cfg.verify_ssl = verify
    return client.ApiClient(configuration=cfg)
