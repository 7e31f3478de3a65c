"""The chart and the code agree: flags exist, agents accept the token public material."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.manifests.conftest import REPO, Render, find


def _known_flags(command: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "aggapi", command, "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(re.findall(r"(?m)^\s+(--[a-z0-9-]+)", r.stdout))


@pytest.mark.parametrize(("kind", "command"), [("Deployment", "apiserver"),
                                               ("DaemonSet", "agent")])
def test_chart_flags_exist(render: Render, kind: str, command: str) -> None:
    args = find(render(), kind)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == command
    used = {a.split("=", 1)[0] for a in args[1:] if a.startswith("--")}
    unknown = sorted(used - _known_flags(command))
    assert not unknown, f"aggapi {command} does not accept {unknown}"


def test_agent_verifier_accepts_the_charts_token_public_material(render: Render) -> None:
    """In helm mode agents get a certificate of the signing key (helm cannot write a bare
    public key): aggapi's own verifier must accept it and check the apiserver's tokens."""
    import base64

    from aggapi.auth.capability import CapabilitySigner, CapabilityVerifier

    docs = render(["tokenSigning.mode=helm"])
    key_pem = base64.b64decode(find(docs, "Secret", "aggapi-token-signing")["data"]["tls.key"])
    public = find(docs, "ConfigMap", "aggapi-token-public")["data"]["token-public.pem"]
    token = CapabilitySigner(key_pem).sign(node="n1", subject="alice", operation="imagepulls")
    cap = CapabilityVerifier(public.encode(), node="n1").verify(token)
    assert cap.subject == "alice"
