"""The chart's key material split between the apiserver and the agents, generated PKI
consistent, per-node agent identities."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.manifests.conftest import APISERVICE, TLS_MODES, Render, find, pod_spec


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_agents_get_only_public_token_material(render: Render, mode: str) -> None:
    sets = TLS_MODES[mode] if "tokenSigning.mode=existingSecret" in TLS_MODES[mode] else [
        *TLS_MODES[mode], "tokenSigning.mode=helm"]
    docs = render(sets)
    signing = "aggapi-token-signing"
    agent = pod_spec(docs, "DaemonSet")
    refs = json.dumps(agent)
    assert signing not in refs
    agent_secrets = {v["secret"]["secretName"] for v in agent["volumes"] if "secret" in v}
    assert agent_secrets == {"aggapi-agent-tls"}
    cms = {v["configMap"]["name"] for v in agent["volumes"] if "configMap" in v}
    assert cms == {"aggapi-token-public"}
    api = pod_spec(docs, "Deployment")
    tok = next(v for v in api["volumes"] if v["name"] == "token-signing")
    assert tok["secret"] == {"secretName": signing, "defaultMode": 0o440,
                             "items": [{"key": "tls.key", "path": "tls.key"}]}
    if "tokenSigning.mode=helm" in sets:
        cm = find(docs, "ConfigMap", "aggapi-token-public")
        pem = cm["data"]["token-public.pem"]
        assert "PRIVATE" not in pem and pem.startswith("-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_no_signing_key_at_rest_by_default(render: Render, mode: str) -> None:
    """tokenSigning.mode=ephemeral (the default): no Secret or ConfigMap holds token
    material; each apiserver replica makes its key in memory and publishes the public
    half itself, and the agents follow the published keys."""
    if "tokenSigning.mode=existingSecret" in TLS_MODES[mode]:
        pytest.skip("this TLS mode's set chooses existingSecret token signing")
    docs = render(TLS_MODES[mode])
    assert not [d for d in docs if "token" in d["metadata"]["name"]
                and d["kind"] in ("Secret", "ConfigMap")]
    api = pod_spec(docs, "Deployment")
    c = api["containers"][0]
    assert "token-signing" not in json.dumps(api)
    assert {"--token-key-set=aggapi", "--pod-namespace=$(POD_NAMESPACE)",
            "--pod-name=$(POD_NAME)", "--pod-uid=$(POD_UID)"} <= set(c["args"])
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
        "POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name",
        "POD_UID": "metadata.uid", "POD_IP": "status.podIP"}
    # one replica computes the collections, elected on a Lease; the others forward
    assert {"--leader-elect=true", "--leader-elect-lease=aggapi-collections",
            "--advertise-address=$(POD_IP)"} <= set(c["args"])
    agent = pod_spec(docs, "DaemonSet")
    assert "token-public" not in json.dumps(agent)
    args = agent["containers"][0]["args"]
    assert {"--token-key-set=aggapi", "--token-key-namespace=aggapi"} <= set(args)
    assert not [a for a in args if a.startswith("--token-public-key-file")]


def test_helm_mode_pki_is_consistent(render: Render) -> None:
    docs = render(["tokenSigning.mode=helm"])
    secrets = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}
    pem = {n: {k: base64.b64decode(v) for k, v in d.items()} for n, d in secrets.items()}
    ca_pem = pem["aggapi-apiserver-tls"]["ca.crt"]
    api = find(docs, "APIService", APISERVICE)
    assert base64.b64decode(api["spec"]["caBundle"]) == ca_pem
    ca = x509.load_pem_x509_certificate(ca_pem)
    for name, cn in [("aggapi-apiserver-tls", "aggapi"), ("aggapi-agent-tls", "aggapi-agent"),
                     ("aggapi-agent-client-tls", "aggapi-apiserver")]:
        assert pem[name]["ca.crt"] == ca_pem
        cert = x509.load_pem_x509_certificate(pem[name]["tls.crt"])
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == cn
    sans = x509.load_pem_x509_certificate(pem["aggapi-apiserver-tls"]["tls.crt"]).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    assert "aggapi.aggapi.svc" in sans
    agent_sans = x509.load_pem_x509_certificate(pem["aggapi-agent-tls"]["tls.crt"]) \
        .extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.DNSName)
    assert "aggapi-agent" in agent_sans

    # Token signing: a P-256 key (ES256) and a certificate of the same key for agents.
    key = serialization.load_pem_private_key(pem["aggapi-token-signing"]["tls.key"], None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    cm = find(docs, "ConfigMap", "aggapi-token-public")
    pub = x509.load_pem_x509_certificate(cm["data"]["token-public.pem"].encode()).public_key()
    raw = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    assert pub.public_bytes(*raw) == key.public_key().public_bytes(*raw)
    # Same CA in the workloads' checksum annotations.
    for kind in ("Deployment", "DaemonSet"):
        assert find(docs, kind)["spec"]["template"]["metadata"]["annotations"]["checksum/ca"]


def test_capability_tokens_verify_with_the_agents_material(render: Render) -> None:
    """The apiserver's key signs, and the public key inside the agents' ConfigMap verifies."""
    import jwt

    docs = render(["tokenSigning.mode=helm"])
    key_pem = base64.b64decode(find(docs, "Secret", "aggapi-token-signing")["data"]["tls.key"])
    cert_pem = find(docs, "ConfigMap", "aggapi-token-public")["data"]["token-public.pem"]
    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    token = jwt.encode({"sub": "u"}, key, algorithm="ES256")
    pub = x509.load_pem_x509_certificate(cert_pem.encode()).public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    assert jwt.decode(token, pub, algorithms=["ES256"])["sub"] == "u"


def test_agents_serve_per_node_identities_by_default(render: Render) -> None:
    """agent.servingIdentity=ephemeral: no agent mounts a serving key; each publishes its
    own, and the apiserver pins agent pods to what they published."""
    docs = render()
    agent = pod_spec(docs, "DaemonSet")
    args = agent["containers"][0]["args"]
    assert "--identity-key-set=aggapi" in args
    assert not [a for a in args if a.startswith(("--tls-cert-file", "--tls-private-key"))]
    tls = next(v for v in agent["volumes"] if v["name"] == "tls")
    assert tls["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    api_args = pod_spec(docs, "Deployment")["containers"][0]["args"]
    assert {"--agent-identity-key-set=aggapi",
            "--agent-service-account=aggapi-agent"} <= set(api_args)
    shared = render(["agent.servingIdentity=certificate"])
    shared_args = pod_spec(shared, "DaemonSet")["containers"][0]["args"]
    assert "--tls-private-key-file=/etc/aggapi/agent/tls.key" in shared_args
    assert not [d for d in shared if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "aggapi-agent"]
