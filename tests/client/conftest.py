"""Fixtures: the fake HTTPS cluster (started and stopped per test) with pod default/web."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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
