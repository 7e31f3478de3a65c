"""Structured logs carry the request's Audit-ID."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from aggapi.serve import logs

from .conftest import PROGRESS, Server


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    buf = io.StringIO()
    logs.configure("info", stream=buf)
    yield buf
    root.handlers[:], root.level = saved[0], saved[1]


async def test_log_lines_are_json_with_audit_id(server: Server, captured: io.StringIO) -> None:
    async with server.session().get(PROGRESS, headers={
            "Audit-ID": "a1b2", "X-Remote-User": "mallory"}) as resp:
        assert resp.status == 401
        assert resp.headers["Audit-ID"] == "a1b2"
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    failure = next(e for e in lines if e["msg"] == "authentication failed")
    assert failure["auditID"] == "a1b2"
    assert failure["reason"] == "untrusted_identity_headers"
    assert failure["level"] == "info" and failure["ts"]


async def test_audit_id_generated_when_absent(server: Server) -> None:
    async with server.session().get("/healthz") as resp:
        assert len(resp.headers["Audit-ID"]) == 36
