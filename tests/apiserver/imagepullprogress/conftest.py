"""Fixtures of the producer tests: a fake kube-apiserver, and agent retries made quick."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from aggapi.apiserver.imagepullprogress import producer as producer_mod
from tests.framework.fakekube import FakeKube


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    fake = FakeKube()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer_mod, "RETRY_DELAY", 0.01)
