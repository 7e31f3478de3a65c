"""tests.framework.rollout's pod probes: what each accepts as an answer."""

from __future__ import annotations

import hashlib
import json

from tests.framework.rollout import Probe, pod_probes


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
