"""The helm chart: lint and template per TLS mode, RBAC exactly as documented, key material
split between the apiserver and the agents, generated PKI consistent."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.manifests.conftest import CHART, TLS_MODES, Render, find, run_helm

GROUP = "subresources.aggapi.io"
APISERVICE = f"v1alpha1.{GROUP}"
AGG = "rbac.authorization.k8s.io/aggregate-to-"


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_lint_and_template_every_tls_mode(helm: str, render: Render, mode: str) -> None:
    sets = TLS_MODES[mode]
    args = ["lint", "--strict", str(CHART), "--namespace", "aggapi"]
    for s in sets:
        args += ["--set", s]
    run_helm(helm, *args)
    docs = render(sets)
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "APIService"):
            assert d["metadata"].get("namespace"), f"{d['kind']} {d['metadata']['name']}"
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "DaemonSet", "Service", "APIService", "PodDisruptionBudget",
            "NetworkPolicy", "ClusterRole", "ClusterRoleBinding", "RoleBinding",
            "ServiceAccount"} <= kinds
    api = find(docs, "APIService", APISERVICE)
    if mode.startswith("certManager"):
        assert "caBundle" not in api["spec"]
        ann = api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert ann == "aggapi/aggapi-apiserver-tls"
        certs = [d for d in docs if d["kind"] == "Certificate"]
        assert {c["spec"]["secretName"] for c in certs} >= {
            "aggapi-apiserver-tls", "aggapi-agent-tls", "aggapi-agent-client-tls"}
        client = find(docs, "Certificate", "aggapi-agent-client-tls")
        assert client["spec"]["commonName"] == "aggapi-apiserver"
        if mode == "certManager-issuer":
            assert not [d for d in docs if d["kind"] == "Issuer"]
            assert client["spec"]["issuerRef"]["kind"] == "ClusterIssuer"
    if mode == "existingSecret":
        assert not [d for d in docs if d["kind"] in ("Secret", "Certificate")]


def test_values_schema_rejects_unknown_and_bad_values(helm: str) -> None:
    import subprocess

    for bad in ("tls.mode=selfsigned", "nosuchkey=1", "apiserver.replicas=0"):
        r = subprocess.run([helm, "template", "x", str(CHART), "--set", bad],
                           capture_output=True, text=True)
        assert r.returncode != 0, bad
        assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr, r.stderr


def test_apiserver_rbac_is_exactly_the_documented_set(render: Render) -> None:
    docs = render()
    role = find(docs, "ClusterRole", "aggapi-apiserver")
    # podimagepulls/nodeimagepulls: a replica forwards them to the leader as itself.
    assert _rules(role) == {(g, r, v) for g, r in [
        ("", "pods"), ("", "events"), ("certificates.k8s.io", "certificatesigningrequests"),
        ("subresources.aggapi.io", "podimagepulls"),
        ("subresources.aggapi.io", "nodeimagepulls")]
        for v in ("get", "list", "watch")}
    # EndpointSlices (the agents'), ConfigMaps (its public token key) and the
    # collections' Lease only in its own namespace: a Role, not a ClusterRole.
    ns_role = find(docs, "Role", "aggapi-apiserver")
    assert ns_role["metadata"]["namespace"] == "aggapi"
    assert _rules(ns_role) == {("discovery.k8s.io", "endpointslices", v)
                               for v in ("get", "list", "watch")} | {
        ("", "configmaps", v) for v in ("get", "create", "update")} | {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    sa = {"kind": "ServiceAccount", "name": "aggapi-apiserver", "namespace": "aggapi"}
    crbs = {d["roleRef"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"
            and d["metadata"]["name"].startswith("aggapi-apiserver")}
    assert set(crbs) == {"aggapi-apiserver", "system:auth-delegator"}
    for b in crbs.values():
        assert b["subjects"] == [sa]
    rbs = {(d["metadata"]["namespace"], d["roleRef"]["name"]): d for d in docs
           if d["kind"] == "RoleBinding" and d["subjects"] == [sa]}
    assert set(rbs) == {("kube-system", "extension-apiserver-authentication-reader"),
                        ("aggapi", "aggapi-apiserver")}
    for (_ns, name), rb in rbs.items():
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": name}
    # No Role/ClusterRole besides ours; the agent is bound to system:auth-delegator
    # (its metrics port's TokenReviews and SubjectAccessReviews) and reads ConfigMaps in
    # its namespace (the published token keys).
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    assert roles == {("ClusterRole", "aggapi-apiserver"), ("Role", "aggapi-apiserver"),
                     ("Role", "aggapi-agent"), ("ClusterRole", "aggapi-agent"),
                     ("ClusterRole", "aggapi-view"), ("ClusterRole", "aggapi-edit"),
                     ("ClusterRole", "aggapi-node-image-pulls-reader")}
    assert _rules(find(docs, "Role", "aggapi-agent")) == {
        ("", "configmaps", v) for v in ("get", "list", "watch")}
    # Its per-node serving identity: create a CSR (agent.servingIdentity=ephemeral).
    assert _rules(find(docs, "ClusterRole", "aggapi-agent")) == {
        ("certificates.k8s.io", "certificatesigningrequests", "create")}
    agent_sa = find(docs, "ServiceAccount", "aggapi-agent")
    assert agent_sa["automountServiceAccountToken"] is False
    agent_sa_ref = {"kind": "ServiceAccount", "name": "aggapi-agent", "namespace": "aggapi"}
    agent_bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                      and agent_sa_ref in d["subjects"]]
    assert sorted((b["kind"], b["roleRef"]["name"]) for b in agent_bindings) == [
        ("ClusterRoleBinding", "aggapi-agent"), ("ClusterRoleBinding", "system:auth-delegator"),
        ("RoleBinding", "aggapi-agent")]
    # With a key file, nobody needs ConfigMaps.
    files = render(["tokenSigning.mode=existingSecret"])
    assert _rules(find(files, "Role", "aggapi-apiserver")) == {
        ("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")} | {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    assert not [d for d in files if d["metadata"]["name"] == "aggapi-agent"
                and d["kind"] in ("Role", "RoleBinding")]


def test_aggregated_roles(render: Render) -> None:
    docs = render()
    view = find(docs, "ClusterRole", "aggapi-view")
    edit = find(docs, "ClusterRole", "aggapi-edit")
    assert {k: v for k, v in view["metadata"]["labels"].items() if k.startswith(AGG)} == {
        AGG + "view": "true", AGG + "edit": "true", AGG + "admin": "true"}
    assert {k: v for k, v in edit["metadata"]["labels"].items() if k.startswith(AGG)} == {
        AGG + "edit": "true", AGG + "admin": "true"}
    assert _rules(view) == {(GROUP, "pods/imagepullprogress", "get"),
                            (GROUP, "pods/imagepullprogress", "watch"),
                            (GROUP, "nodes/imagepulls", "get")} | {
        (GROUP, "podimagepulls", v) for v in ("get", "list", "watch")}
    # nodeimagepulls names every namespace's images: cluster readers only, never view
    nodes = find(docs, "ClusterRole", "aggapi-node-image-pulls-reader")
    assert _rules(nodes) == {(GROUP, "nodeimagepulls", v) for v in ("get", "list", "watch")}
    assert {k for k in nodes["metadata"]["labels"] if k.startswith(AGG)} == {
        AGG + "cluster-reader"}
    assert _rules(edit) == {(GROUP, "pods/copy", v) for v in ("get", "create", "watch")}
    off = render(["rbac.aggregateToDefaultRoles=false"])
    assert not [d for d in off if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] not in ("aggapi-apiserver", "aggapi-agent")]


def _pod_spec(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind)["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("mode", sorted(TLS_MODES))
def test_agents_get_only_public_token_material(render: Render, mode: str) -> None:
    sets = TLS_MODES[mode] if "tokenSigning.mode=existingSecret" in TLS_MODES[mode] else [
        *TLS_MODES[mode], "tokenSigning.mode=helm"]
    docs = render(sets)
    signing = "aggapi-token-signing"
    agent = _pod_spec(docs, "DaemonSet")
    refs = json.dumps(agent)
    assert signing not in refs
    agent_secrets = {v["secret"]["secretName"] for v in agent["volumes"] if "secret" in v}
    assert agent_secrets == {"aggapi-agent-tls"}
    cms = {v["configMap"]["name"] for v in agent["volumes"] if "configMap" in v}
    assert cms == {"aggapi-token-public"}
    api = _pod_spec(docs, "Deployment")
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
    api = _pod_spec(docs, "Deployment")
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
    agent = _pod_spec(docs, "DaemonSet")
    assert "token-public" not in json.dumps(agent)
    args = agent["containers"][0]["args"]
    assert {"--token-key-set=aggapi", "--token-key-namespace=aggapi"} <= set(args)
    assert not [a for a in args if a.startswith("--token-public-key-file")]


def test_apiserver_on_control_plane_preset(render: Render) -> None:
    docs = render(["apiserver.onControlPlane=true", "apiserver.nodeSelector.zone=a"])
    api = _pod_spec(docs, "Deployment")
    assert api["nodeSelector"] == {"node-role.kubernetes.io/control-plane": "", "zone": "a"}
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
            "effect": "NoSchedule"} in api["tolerations"]
    assert "nodeSelector" not in _pod_spec(render(), "Deployment")


def test_replicas_spread_over_nodes_even_while_one_shuts_down(render: Render) -> None:
    """soft: anti-affinity, plus a node spread constraint (the scheduler ignores a
    terminating replica there, not in anti-affinity); none with hard or the user's own."""
    api = _pod_spec(render(), "Deployment")
    assert "preferredDuringSchedulingIgnoredDuringExecution" in api["affinity"]["podAntiAffinity"]
    (tsc,) = api["topologySpreadConstraints"]
    assert {k: tsc[k] for k in ("maxSkew", "topologyKey", "whenUnsatisfiable",
                                "nodeTaintsPolicy", "matchLabelKeys")} == {
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway", "nodeTaintsPolicy": "Honor",
        "matchLabelKeys": ["pod-template-hash"]}
    assert tsc["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "apiserver"
    assert "topologySpreadConstraints" not in _pod_spec(
        render(["apiserver.antiAffinity=hard"]), "Deployment")
    (own,) = _pod_spec(render([
        "apiserver.topologySpreadConstraints[0].maxSkew=2",
        "apiserver.topologySpreadConstraints[0].topologyKey=zone",
        "apiserver.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule"]),
        "Deployment")["topologySpreadConstraints"]
    assert own["topologyKey"] == "zone"


def test_cpu_requested_not_limited_by_default(render: Render) -> None:
    """A CFS quota throttles a copy even on an idle node (issue 27: the agent at 500m was
    throttled 155 times over two uploads of 100 files of 10 MiB): CPU is requested, not
    limited; memory is both. A limit set in the values is rendered as given."""
    for kind in ("Deployment", "DaemonSet"):
        res = _pod_spec(render(), kind)["containers"][0]["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"], kind
        assert "cpu" not in res["limits"] and res["limits"]["memory"], kind
    capped = render(["agent.resources.limits.cpu=2", "apiserver.resources.limits.cpu=3"])
    assert _pod_spec(capped, "DaemonSet")["containers"][0]["resources"]["limits"]["cpu"] == 2
    assert _pod_spec(capped, "Deployment")["containers"][0]["resources"]["limits"]["cpu"] == 3


def test_workload_security(render: Render) -> None:
    docs = render()
    api = _pod_spec(docs, "Deployment")
    c = api["containers"][0]
    assert api["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert find(docs, "Deployment")["spec"]["replicas"] == 2
    assert "podAntiAffinity" in api["affinity"]
    assert find(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1

    ag = _pod_spec(docs, "DaemonSet")
    c = ag["containers"][0]
    assert ag["hostPID"] is True and ag["automountServiceAccountToken"] is False
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    # Explicit capabilities, not privileged; no privilege escalation (issue 24, finding 10).
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": [
        "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "SETGID", "SETUID",
        "SYS_PTRACE"]}
    assert sc["runAsUser"] == 0 and sc["readOnlyRootFilesystem"] is True
    assert ag["tolerations"] == [{"operator": "Exists"}]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"] for v in ag["volumes"] if "hostPath" in v}
    assert host["cri-socket-dir"] == {"path": "/run/containerd", "type": "Directory"}
    # The kubelet config is read through the host's root (hostPID), never mounted: a node
    # without the file must still run the agent (kubelet defaults).
    assert "kubelet-config" not in host and "kubelet-config" not in mounts
    assert "--kubelet-config=/proc/1/root/var/lib/kubelet/config.yaml" in c["args"]
    assert mounts["cri-socket-dir"]["readOnly"] is True
    assert "readOnly" not in mounts["copy-state"]  # the one writable host path

    svc = find(docs, "Service", "aggapi-agent")
    assert svc["spec"]["clusterIP"] == "None"
    np = find(docs, "NetworkPolicy")
    assert np["spec"]["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "aggapi", "app.kubernetes.io/instance": "aggapi",
            "app.kubernetes.io/component": "apiserver"}}}],
        "ports": [{"port": 10443, "protocol": "TCP"}]}]


def test_servicemonitor_only_with_the_crd(render: Render) -> None:
    assert not [d for d in render(["serviceMonitor.enabled=true"])
                if d["kind"] == "ServiceMonitor"]
    docs = render(["serviceMonitor.enabled=true"],
                  extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"])
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"aggapi", "aggapi-agent"}
    for sm in monitors.values():
        ep = sm["spec"]["endpoints"][0]
        assert ep["path"] == "/metrics" and ep["scheme"] == "https"
        assert "bearerTokenFile" not in ep
        assert ep["authorization"] == {"type": "Bearer", "credentials": {
            "name": "aggapi-metrics-reader-token", "key": "token"}}
    # Each ServiceMonitor selects exactly one of the chart's Services, on a port it has.
    services = [d for d in docs if d["kind"] == "Service"]
    for sm in monitors.values():
        sel = sm["spec"]["selector"]["matchLabels"]
        hits = [s for s in services
                if sel.items() <= s["metadata"]["labels"].items()]
        assert len(hits) == 1, sm["metadata"]["name"]
        port = sm["spec"]["endpoints"][0]["port"]
        assert port in {p["name"] for p in hits[0]["spec"]["ports"]}
    # The apiservers' certificate chains to the CA; the agents' are each their own
    # (agent.servingIdentity=ephemeral), so Prometheus cannot verify them.
    assert monitors["aggapi"]["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"] == {
        "name": "aggapi-apiserver-tls", "key": "ca.crt"}
    assert monitors["aggapi-agent"]["spec"]["endpoints"][0]["tlsConfig"] == {
        "insecureSkipVerify": True}
    shared = render(["serviceMonitor.enabled=true", "agent.servingIdentity=certificate"],
                    extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"])
    sm = find(shared, "ServiceMonitor", "aggapi-agent")
    assert sm["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]["name"] == "aggapi-agent-tls"
    agent_svc = find(docs, "Service", "aggapi-agent-metrics")
    assert agent_svc["spec"]["ports"] == [{"name": "metrics", "port": 10445,
                                           "targetPort": 10445, "protocol": "TCP"}]
    # The token's ServiceAccount may get /metrics and nothing else.
    token = find(docs, "Secret", "aggapi-metrics-reader-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "aggapi-metrics-reader"}
    role = find(docs, "ClusterRole", "aggapi-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = find(docs, "ClusterRoleBinding", "aggapi-metrics-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "aggapi-metrics-reader",
                                    "namespace": "aggapi"}]
    # Credentials of the user's own: no reader objects are made.
    own = render(["serviceMonitor.enabled=true", "serviceMonitor.authorization.type=Bearer",
                  "serviceMonitor.authorization.credentials.name=prom",
                  "serviceMonitor.authorization.credentials.key=t"],
                 extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"])
    assert not [d for d in own if "metrics-reader" in d["metadata"]["name"]]
    assert {d["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
            for d in own if d["kind"] == "ServiceMonitor"} == {"prom"}


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


def test_release_name_changes_object_names(render: Render) -> None:
    docs = render(release="team-a", namespace="tools")
    names = {d["metadata"]["name"] for d in docs}
    assert {"team-a-aggapi", "team-a-aggapi-agent", "team-a-aggapi-view"} <= names
    api = find(docs, "APIService", APISERVICE)
    assert api["spec"]["service"] == {"name": "team-a-aggapi", "namespace": "tools",
                                      "port": 443}
    args = _pod_spec(docs, "Deployment")["containers"][0]["args"]
    assert "--agent-service=team-a-aggapi-agent" in args
    assert "--agent-namespace=tools" in args


def test_copy_as_root_is_opt_in_and_parses(render: Render) -> None:
    from aggapi.agent.config import parser

    for sets, want in (((), False), (("agent.copyAsRoot=true",), True)):
        args = _pod_spec(render(sets), "DaemonSet")["containers"][0]["args"]
        assert ("--copy-as-root" in args) is want
        ns = parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args[1:]])
        assert ns.copy_as_root is want


def test_agent_drain_fits_in_its_grace_period(render: Render) -> None:
    """Issue 35: copies drain for drainSeconds after SIGTERM, which comes after the
    preStop sleep; the kubelet kills the agent only once both (and 5 s) have passed."""
    from aggapi.agent.config import parser

    for sets, grace in (((), 25), (("agent.drainSeconds=40", "agent.preStopSleepSeconds=0"),
                                   45)):
        spec = _pod_spec(render(sets), "DaemonSet")
        args = spec["containers"][0]["args"]
        ns = parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args[1:]])
        assert spec["terminationGracePeriodSeconds"] == grace
        assert ns.drain_timeout == grace - 5 - (5 if not sets else 0)


def test_agent_metrics_port_and_its_credentials(render: Render) -> None:
    """The metrics port (always on): its flag, container port and the explicit
    ServiceAccount token mount go together."""
    from aggapi.agent.config import parser

    docs = render()
    ag = _pod_spec(docs, "DaemonSet")
    c = ag["containers"][0]
    ns = parser().parse_args(c["args"][1:])
    assert (ns.metrics_port, ns.metrics_auth) == (10445, "delegated")
    assert {"name": "metrics", "containerPort": 10445, "protocol": "TCP"} in c["ports"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "kube-api-access")
    assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    sources = next(v for v in ag["volumes"] if v["name"] == "kube-api-access")
    assert sources["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
    assert find(docs, "ClusterRoleBinding", "aggapi-agent:system:auth-delegator")



def test_agents_serve_per_node_identities_by_default(render: Render) -> None:
    """agent.servingIdentity=ephemeral: no agent mounts a serving key; each publishes its
    own, and the apiserver pins agent pods to what they published."""
    docs = render()
    agent = _pod_spec(docs, "DaemonSet")
    args = agent["containers"][0]["args"]
    assert "--identity-key-set=aggapi" in args
    assert not [a for a in args if a.startswith(("--tls-cert-file", "--tls-private-key"))]
    tls = next(v for v in agent["volumes"] if v["name"] == "tls")
    assert tls["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    api_args = _pod_spec(docs, "Deployment")["containers"][0]["args"]
    assert {"--agent-identity-key-set=aggapi",
            "--agent-service-account=aggapi-agent"} <= set(api_args)
    shared = render(["agent.servingIdentity=certificate"])
    shared_args = _pod_spec(shared, "DaemonSet")["containers"][0]["args"]
    assert "--tls-private-key-file=/etc/aggapi/agent/tls.key" in shared_args
    assert not [d for d in shared if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "aggapi-agent"]
