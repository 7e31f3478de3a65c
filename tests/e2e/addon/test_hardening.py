"""The agent without ``privileged`` (issue 24, finding 10): explicit capabilities and no
privilege escalation still copy into and out of a root container whose files belong to
another user (DAC_OVERRIDE, and FOWNER to replace a file in the sticky /tmp), and the
agent pods run unprivileged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aggapi.auth import agentidentity as ai
from tests.e2e.addon.helpers import SLEEPER, delete_pods, download, exec_in, path, sha256
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.kubelet import pod_manifest

pytestmark = pytest.mark.e2e


def test_unprivileged_agent_copies_as_root_over_another_users_file(
        installed_addon: Addon, two_node_cluster: Cluster, tmp_path: Path) -> None:
    a, cp = installed_addon, installed_addon.cp
    for pod in a.pods("agent"):
        sc = pod["spec"]["containers"][0]["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False, sc
        assert "SYS_PTRACE" in sc["capabilities"]["add"], sc
    node = two_node_cluster.node(1)
    name = "addon-root"
    c = {"name": "c", "image": SLEEPER, "command": ["sleep", "3600"],
         "securityContext": {"runAsUser": 0, "runAsGroup": 0}}
    cp.kubectl("delete", "pod", name, "--ignore-not-found", "--grace-period=0", "--force")
    cp.kubectl("create", "-f", "-", input=json.dumps(
        pod_manifest(name, [c], node=node.name, pull_policy="Never")))
    try:
        cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
        # A file of uid 65532, mode 0600, in the sticky /tmp: root in the container may
        # read it and replace it only with DAC_OVERRIDE and FOWNER.
        exec_in(cp, name, "sh", "-c", "head -c 100000 /dev/urandom > /tmp/theirs && "
                "chown 65532:65532 /tmp/theirs && chmod 600 /tmp/theirs")
        inside = exec_in(cp, name, "sha256sum", "/tmp/theirs").split()[0]
        got = download(cp, path("copy", name, container="c", path="/tmp/theirs"),
                       tmp_path / "theirs")
        assert got == inside
        data = os.urandom(2_000_000)
        src = tmp_path / "new"
        src.write_bytes(data)
        r = cp.kubectl("create", "--raw", path("copy", name, container="c", path="/tmp/theirs"),
                       "-f", str(src))
        assert json.loads(r.stdout)["sha256"] == sha256(data)
        assert exec_in(cp, name, "sha256sum", "/tmp/theirs").split()[0] == sha256(data)
        print(f"\nhardening: unprivileged agent on {node.name} read and replaced a 0600 file "
              "of uid 65532 in /tmp of a root container")
    finally:
        delete_pods(cp, name)


def test_each_agent_serves_its_own_published_identity(installed_addon: Addon) -> None:
    """agent.servingIdentity=ephemeral: one CSR per agent pod, which kube-apiserver marks
    with that pod and its node; every agent's certificate (and key) differs."""
    a = installed_addon
    csrs = a.get_json("csr", f"-l={ai.LABEL}={a.fullname}")["items"]
    username = f"system:serviceaccount:{a.namespace}:{a.agent_name}"
    pins = {}
    for csr in csrs:
        got = ai.pin_of(csr, username=username)
        assert not isinstance(got, str), (csr["metadata"]["name"], got)
        pins[got[0]] = got[1]
    agents = a.pods("agent")
    assert agents
    for pod in agents:
        pin = pins.get(pod["metadata"]["uid"])
        assert pin is not None, f"no identity published by {pod['metadata']['name']}"
        assert pin.node == pod["spec"]["nodeName"]
    certs = {pins[p["metadata"]["uid"]].cert_pem for p in agents}
    assert len(certs) == len(agents)
    print(f"\nhardening: {len(agents)} agents, each pinned to its own certificate "
          f"({', '.join(sorted(ai.fingerprint(c)[:12] for c in certs))})")
