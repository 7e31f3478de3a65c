"""The chart's workloads: placement and spread, resources, security context, the
ServiceMonitor, copy as root, the agent's drain and metrics port."""

from __future__ import annotations

import subprocess

from tests.manifests.conftest import CHART, Render, find, pod_spec


def test_apiserver_on_control_plane_preset(render: Render) -> None:
    docs = render(["apiserver.onControlPlane=true", "apiserver.nodeSelector.zone=a"])
    api = pod_spec(docs, "Deployment")
    assert api["nodeSelector"] == {"node-role.kubernetes.io/control-plane": "", "zone": "a"}
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
            "effect": "NoSchedule"} in api["tolerations"]
    assert "nodeSelector" not in pod_spec(render(), "Deployment")


def test_replicas_spread_over_nodes_even_while_one_shuts_down(render: Render) -> None:
    """soft: anti-affinity, plus a node spread constraint (the scheduler ignores a
    terminating replica there, not in anti-affinity); none with hard or the user's own."""
    api = pod_spec(render(), "Deployment")
    assert "preferredDuringSchedulingIgnoredDuringExecution" in api["affinity"]["podAntiAffinity"]
    (tsc,) = api["topologySpreadConstraints"]
    assert {k: tsc[k] for k in ("maxSkew", "topologyKey", "whenUnsatisfiable",
                                "nodeTaintsPolicy", "matchLabelKeys")} == {
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway", "nodeTaintsPolicy": "Honor",
        "matchLabelKeys": ["pod-template-hash"]}
    assert tsc["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "apiserver"
    assert "topologySpreadConstraints" not in pod_spec(
        render(["apiserver.antiAffinity=hard"]), "Deployment")
    (own,) = pod_spec(render([
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
        res = pod_spec(render(), kind)["containers"][0]["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"], kind
        assert "cpu" not in res["limits"] and res["limits"]["memory"], kind
    capped = render(["agent.resources.limits.cpu=2", "apiserver.resources.limits.cpu=3"])
    assert pod_spec(capped, "DaemonSet")["containers"][0]["resources"]["limits"]["cpu"] == 2
    assert pod_spec(capped, "Deployment")["containers"][0]["resources"]["limits"]["cpu"] == 3


def test_workload_security(render: Render) -> None:
    docs = render()
    api = pod_spec(docs, "Deployment")
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

    ag = pod_spec(docs, "DaemonSet")
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


def test_copy_as_root_is_opt_in_and_parses(render: Render) -> None:
    from aggapi.agent.config import parser

    for sets, want in (((), False), (("agent.copyAsRoot=true",), True)):
        args = pod_spec(render(sets), "DaemonSet")["containers"][0]["args"]
        assert ("--copy-as-root" in args) is want
        ns = parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args[1:]])
        assert ns.copy_as_root is want


def test_agent_drain_fits_in_its_grace_period(render: Render) -> None:
    """Issue 35: copies drain for drainSeconds after SIGTERM, which comes after the
    preStop sleep; the kubelet kills the agent only once both (and 5 s) have passed."""
    from aggapi.agent.config import parser

    for sets, grace in (((), 25), (("agent.drainSeconds=40", "agent.preStopSleepSeconds=0"),
                                   45)):
        spec = pod_spec(render(sets), "DaemonSet")
        args = spec["containers"][0]["args"]
        ns = parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args[1:]])
        assert spec["terminationGracePeriodSeconds"] == grace
        assert ns.drain_timeout == grace - 5 - (5 if not sets else 0)


def test_agent_metrics_port_and_its_credentials(render: Render) -> None:
    """The metrics port (always on): its flag, container port and the explicit
    ServiceAccount token mount go together."""
    from aggapi.agent.config import parser

    docs = render()
    ag = pod_spec(docs, "DaemonSet")
    c = ag["containers"][0]
    ns = parser().parse_args(c["args"][1:])
    assert (ns.metrics_port, ns.metrics_auth) == (10445, "delegated")
    assert {"name": "metrics", "containerPort": 10445, "protocol": "TCP"} in c["ports"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "kube-api-access")
    assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    sources = next(v for v in ag["volumes"] if v["name"] == "kube-api-access")
    assert sources["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
    assert find(docs, "ClusterRoleBinding", "aggapi-agent:system:auth-delegator")


def test_apiserver_hand_over_fits_its_grace_period(render: Render, helm: str) -> None:
    """--handover-timeout runs beside --shutdown-delay and what outlasts it comes off
    --shutdown-grace: the kubelet must not kill a leader mid-hand-over."""
    from aggapi.apiserver.config import parse_args

    for sets, want in (((), 25.0), (("apiserver.handoverTimeoutSeconds=0",), 0.0),
                       (("apiserver.handoverTimeoutSeconds=35",), 35.0)):
        spec = pod_spec(render(sets), "Deployment")
        cfg = parse_args(spec["containers"][0]["args"][1:], env={})
        assert cfg.handover_timeout == want
        assert cfg.handover_timeout <= cfg.shutdown_delay + cfg.shutdown_grace
        assert spec["terminationGracePeriodSeconds"] >= \
            cfg.shutdown_delay + cfg.shutdown_grace + cfg.shutdown_final
    r = subprocess.run([helm, "template", "aggapi", str(CHART), "--set",
                        "apiserver.handoverTimeoutSeconds=36"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "handoverTimeoutSeconds may be at most" in r.stderr
