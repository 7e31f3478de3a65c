"""Fixtures: the fake HTTPS cluster (started and stopped per test) with pod default/web."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aggapi.client import fastpath
from tests.client.fakeserver import FakeCluster, Pod


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[FakeCluster]:
    app, side = tmp_path / "rootfs-app", tmp_path / "rootfs-side"
    for d in (app, side):
        (d / "data").mkdir(parents=True)
    fc = FakeCluster(tmp_path / "srv")
    fc.pods[("default", "web")] = Pod({"app": app, "side": side})
    await fc.start()
    try:
        yield fc
    finally:
        await fc.stop()


@pytest.fixture(params=["python", "compiled"])
def extract_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once on each extraction path (aggapi.client.fastpath): the Python
    extractor alone, and with the compiled loop (skipped where it is not built)."""
    if request.param == "python":
        monkeypatch.setenv("AGGAPI_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("AGGAPI_PURE_PYTHON", raising=False)
        if not fastpath.loaded():
            pytest.skip("aggapi.client._fastextract is not built here")
    return str(request.param)
