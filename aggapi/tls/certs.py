"""`aggapi certs`: generate the PKI aggapi needs into a directory.

Layout (every consumer, the helm chart and the harness included, uses these names):

    ca.crt ca.key                 aggapi's internal CA (serving certs and agent mTLS)
    apiserver.crt apiserver.key   the apiserver's serving cert (APIService caBundle = ca.crt)
    agent.crt agent.key           the agents' serving cert
    agent-client.crt/.key         the apiserver's client cert towards agents
    token-signing.key/.pub        ES256 key pair for capability tokens

Existing files are kept unless --force, so re-running is safe (idempotent).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from aggapi.tls import pki

APISERVER_CLIENT_CN = "aggapi-apiserver"
AGENT_CN = "aggapi-agent"


def default_apiserver_dns(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        "localhost",
    ]


def generate(
    out: Path,
    *,
    namespace: str = "aggapi",
    service: str = "aggapi",
    agent_service: str = "aggapi-agent",
    extra_dns: list[str] | None = None,
    ips: list[str] | None = None,
    force: bool = False,
) -> list[Path]:
    """Write the PKI into ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ips = ips if ips is not None else ["127.0.0.1"]

    def have(*names: str) -> bool:
        return not force and all((out / n).exists() for n in names)

    if have("ca.crt", "ca.key"):
        ca = pki.load_pair(out / "ca.crt", out / "ca.key")
    else:
        ca = pki.new_ca("aggapi-ca")
        ca.write(out / "ca.crt", out / "ca.key")
        written += [out / "ca.crt", out / "ca.key"]
        force = True  # a new CA invalidates every leaf

    @dataclass(frozen=True)
    class Leaf:
        cn: str
        dns: list[str]
        server: bool = False
        client: bool = False

    leaves = {
        "apiserver": Leaf(service, default_apiserver_dns(service, namespace) + (extra_dns or []),
                          server=True),
        "agent": Leaf(AGENT_CN, [agent_service, f"{agent_service}.{namespace}.svc", "localhost",
                                 *(extra_dns or [])], server=True),
        "agent-client": Leaf(APISERVER_CLIENT_CN, [], client=True),
    }
    for name, leaf in leaves.items():
        if have(f"{name}.crt", f"{name}.key"):
            continue
        pair = pki.issue(ca, leaf.cn, dns=leaf.dns, ips=ips if leaf.server else [],
                         server=leaf.server, client=leaf.client)
        pair.write(out / f"{name}.crt", out / f"{name}.key")
        written += [out / f"{name}.crt", out / f"{name}.key"]

    if not have("token-signing.key", "token-signing.pub"):
        key = pki.new_key("ec")
        pki.write_file(out / "token-signing.key", pki.private_key_pem(key), mode=0o600)
        pki.write_file(out / "token-signing.pub", pki.public_key_pem(key))
        written += [out / "token-signing.key", out / "token-signing.pub"]
    return written


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="aggapi certs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="certs", type=Path, help="output directory")
    p.add_argument("--namespace", default="aggapi")
    p.add_argument("--service", default="aggapi", help="the apiserver's Service name")
    p.add_argument("--agent-service", default="aggapi-agent")
    p.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    p.add_argument("--ip", action="append", default=None, help="IP SAN (repeatable)")
    p.add_argument("--force", action="store_true", help="regenerate everything")
    a = p.parse_args(argv)
    for path in generate(a.out, namespace=a.namespace, service=a.service,
                         agent_service=a.agent_service, extra_dns=a.dns, ips=a.ip,
                         force=a.force):
        print(path)
    return 0
