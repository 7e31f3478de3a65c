"""A plugin's start-up imports aiohttp without the system CA bundle its two default SSL
contexts would load (about a third of the start-up's CPU), and nothing else loses the
system's trust: a context made afterwards, as the kubeconfig's is, still has it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A plugin run (run_plugin, as both plugins' main) whose command reports what the
# contexts trust: aiohttp's defaults, and one made the way the kubeconfig's is made.
PROBE = """
import json, ssl, sys
from aggapi.plugins.common import new_parser, run_plugin

async def probe(args):
    import aiohttp.connector as c
    from aggapi.kube.kubeconfig import ssl_context
    out = {"aiohttp_verified": c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
           "aiohttp_unverified": c._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"],
           "kubeconfig_without_ca": ssl_context().cert_store_stats()["x509_ca"],
           "system": ssl.create_default_context().cert_store_stats()["x509_ca"],
           "own_method": "set_default_verify_paths" in ssl.SSLContext.__dict__}
    print(json.dumps(out))
    return 0

sys.exit(run_plugin(new_parser("kubectl probe", "probe"), [], probe))
"""


def test_plugin_start_up_skips_aiohttps_default_ca_loading_only() -> None:
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["aiohttp_verified"] == 0 and got["aiohttp_unverified"] == 0
    # Afterwards every context loads the defaults as before (the method is restored).
    assert got["kubeconfig_without_ca"] == got["system"]
    assert got["own_method"] is False
    bare = subprocess.run([sys.executable, "-c", "import ssl; print(ssl.create_default_"
                           "context().cert_store_stats()['x509_ca'])"],
                          capture_output=True, text=True, timeout=60)
    assert got["system"] == int(bare.stdout)
