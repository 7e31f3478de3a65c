"""tests.framework.rollout's pod probes: what each accepts as an answer."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import cast

from tests.framework.controlplane import ControlPlane
from tests.framework.rollout import Probe, Prober, pod_probes


def _by_name(size: int = 4096) -> dict[str, Probe]:
    return {p.name: p for p in pod_probes("default", "web", "c", size=size)}


def test_upload_is_checked_against_the_agents_digest() -> None:
    up = _by_name()["upload"]
    assert (up.method, up.data is not None) == ("POST", True)
    assert up.data is not None and len(up.data) == 4096
    good = json.dumps({"sha256": hashlib.sha256(up.data).hexdigest()}).encode()
    assert up.check(200, good) == "" and up.check(201, good) == ""
    assert up.check(200, json.dumps({"sha256": "0" * 64}).encode())
    assert up.check(503, good)


def test_download_must_return_the_uploaded_bytes() -> None:
    probes = _by_name()
    data, down = probes["upload"].data, probes["download"]
    assert data is not None and down.method == "GET" and down.path == probes["upload"].path
    assert down.check(200, data) == ""
    assert down.check(200, data[:-1])
    assert down.check(404, data)


def test_progress_snapshot_needs_objects_and_no_error() -> None:
    snap = _by_name()["progress"]
    assert "follow=false" in snap.path
    ok = b'{"kind":"ImagePullProgress"}\n'
    assert snap.check(200, ok) == ""
    assert snap.check(200, b"")
    assert snap.check(200, ok + b'{"kind":"Error","message":"agent gone"}\n')
    assert snap.check(503, ok)


class _FakeAPI:
    """Answers the Prober's requests: the APIService Available, node-b's view 503."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def request(self, method: str, path: str, data: bytes | None = None, *,
                timeout: float = 5.0) -> tuple[int, bytes]:
        self.threads.add(threading.get_ident())
        return (503, b"no agent") if path.endswith("/nodes/node-b/imagepulls") else (200, b"{}")

    def get(self, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
        return 200, json.dumps({"status": {"conditions": [
            {"type": "Available", "status": "True"}]}}).encode()


def test_prober_workers_send_concurrently_and_count_each_kind() -> None:
    api = _FakeAPI()
    with Prober(cast(ControlPlane, api), ["node-a", "node-b"], interval=0.01,
                workers=3) as p:
        deadline = time.monotonic() + 10
        while p.result.requests < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
    r = p.result
    assert len(api.threads) == 3
    assert sum(r.sent.values()) == r.requests >= 60
    assert set(r.sent) == {"discovery", "node view"}
    # Exactly the node-b requests failed, each named.
    assert r.failures and all("/nodes/node-b/imagepulls: 503" in f for f in r.failures)
    assert r.sent["node view"] - len(r.failures) >= 1
    assert r.unavailable_seconds == 0
