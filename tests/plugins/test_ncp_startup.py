"""What ``kubectl ncp -q`` loads on a download: its start-up is most of a small copy's
time (issue 27, item 3; figures from benchmarks/bench_client_start.py).

Run in a fresh interpreter against the fake cluster, as the plugin runs: rich (the
progress bar) is not imported with -q, yaml not for a JSON kubeconfig, aiohttp's
import-time default TLS contexts trust nothing, so the system's CA bundle is not read
for them (the copy itself still verifies the server with the kubeconfig's CA), and the
loaded modules are frozen out of the collector's walks (gc.freeze), the one at exit
too.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.kube.kubeconfig import parse_document, ssl_context
from tests.client.fakeserver import FakeCluster

REPO = Path(__file__).resolve().parents[2]

DRIVER = """
import gc, json, os, sys
from aggapi.plugins import ncp
rc = ncp.main(sys.argv[1:])
import aiohttp.connector as c  # (loaded by the copy already)
print(json.dumps({
    "rc": rc, "frozen": gc.get_freeze_count(),
    "loaded": sorted(m for m in ("rich", "yaml") if m in sys.modules),
    "aiohttp_default_cas": c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
    "env": [os.environ.get(k) for k in ("SSL_CERT_FILE", "SSL_CERT_DIR")]}))
"""


async def run_driver(cluster: FakeCluster, kubeconfig: Path, out: Path) -> dict[str, Any]:
    # The fake's CA as the "system" store: whatever reads the default store finds it.
    env = {**os.environ, "PYTHONPATH": str(REPO), "SSL_CERT_FILE": str(cluster.ca_file),
           "SSL_CERT_DIR": str(out.parent / "no-certs")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DRIVER, "-q", f"--kubeconfig={kubeconfig}", "-c", "app",
        "web:/data/f.txt", str(out), env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    return dict(json.loads(stdout.decode().splitlines()[-1]), expected_env=[
        env["SSL_CERT_FILE"], env["SSL_CERT_DIR"]])


async def test_download_with_json_kubeconfig_loads_neither_rich_nor_yaml(
        cluster: FakeCluster, tmp_path: Path) -> None:
    root = cluster.pods[("default", "web")].containers["app"]
    (root / "data/f.txt").write_text("hello\n")
    res = await run_driver(cluster, cluster.kubeconfig(), tmp_path / "f.txt")
    assert res["rc"] == 0 and (tmp_path / "f.txt").read_text() == "hello\n"
    assert res["loaded"] == []
    assert res["frozen"] > 10_000  # main: 0 (the imports alone are ~100k objects)
    assert res["aiohttp_default_cas"] == 0  # main: 1, the fake's CA read from the store
    assert res["env"] == res["expected_env"]  # the user's trust store settings, back


async def test_download_with_yaml_kubeconfig(cluster: FakeCluster, tmp_path: Path) -> None:
    root = cluster.pods[("default", "web")].containers["app"]
    (root / "data/f.txt").write_text("hello\n")
    kc = tmp_path / "kubeconfig.yaml"
    kc.write_text(yaml.safe_dump(json.loads(cluster.kubeconfig().read_text())))
    res = await run_driver(cluster, kc, tmp_path / "f.txt")
    assert res["rc"] == 0 and (tmp_path / "f.txt").read_text() == "hello\n"
    assert res["loaded"] == ["yaml"]


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20)
docs = st.recursive(st.none() | st.booleans() | st.integers() | text,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(text, inner, max_size=4), max_leaves=20)


@settings(derandomize=True, max_examples=200)
@given(st.dictionaries(text, docs, max_size=5))
def test_parse_document_reads_json_and_yaml_alike(doc: dict[str, Any]) -> None:
    assert parse_document(json.dumps(doc, indent=2)) == doc
    assert parse_document(yaml.safe_dump(doc)) == doc
    assert parse_document(yaml.safe_dump(doc, default_flow_style=True)) == doc


def test_parse_document_refuses_what_is_neither() -> None:
    for bad in ("{a: [", "{\"a\": 1", "key: value: other\n"):
        with pytest.raises(ValueError):
            parse_document(bad)


def test_only_a_verifying_context_reads_the_trust_store(cluster: FakeCluster,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(cluster.ca_file))  # the "system" store
    assert ssl_context().cert_store_stats()["x509_ca"] == 1
    insecure = ssl_context(verify=False)  # --insecure-skip-tls-verify: checks nothing
    assert insecure.cert_store_stats()["x509_ca"] == 0  # main: 1, read for nothing
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
