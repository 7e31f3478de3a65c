"""What ``pip install 'aggapi[plugins]'`` brings in, resolved by pip against the package
index (a dry run from a copy of the checkout): the plugins need aiohttp, PyYAML and rich,
not the servers' gRPC, protobuf, prometheus, crypto or uvloop stack.

The servers' libraries are the ``server`` extra (the image installs ``aggapi[server]``);
before that split the plugins extra pulled them in, about 55 of a 112 MB venv.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.framework.repo import REPO

pytestmark = pytest.mark.slow

SERVER_STACK = {"grpcio", "protobuf", "prometheus-client", "cryptography", "pyjwt",
                "uvloop", "cffi"}
PLUGIN_NEEDS = {"aggapi", "aiohttp", "pyyaml", "rich"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(src: Path, requirement: str, report: Path) -> set[str]:
    """The distributions pip would install for ``requirement`` into an empty environment."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--dry-run", "--ignore-installed", "--report", str(report), requirement],
                   check=True, timeout=300, cwd=src)
    return {canonical(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}


def test_plugins_extra_leaves_out_the_server_stack(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "aggapi", src / "aggapi",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    got = resolve(src, f"{src}[plugins]", tmp_path / "report.json")
    assert got >= PLUGIN_NEEDS
    assert not got & SERVER_STACK, sorted(got & SERVER_STACK)
