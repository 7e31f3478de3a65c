"""Plugin fixtures: the fake cluster of tests/client plus the plugins on a temp PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.client.conftest import cluster  # noqa: F401  (re-exported fixture)
from tests.plugins.helpers import KUBECTL, install_plugins


@pytest.fixture
def plugin_bin(tmp_path: Path) -> Path:
    if not os.access(KUBECTL, os.X_OK):
        pytest.skip(f"kubectl not found: {KUBECTL or 'run hack/build-binaries.sh kubectl'}")
    install_plugins(tmp_path / "bin")
    return tmp_path / "bin"
