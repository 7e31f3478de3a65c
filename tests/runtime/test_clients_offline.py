"""Client behaviour that needs no runtime: addresses and error mapping."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from aggapi.runtime.channel import unix_target
from aggapi.runtime.containerd import ContainerdClient, IngestStatus
from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import (
    RuntimeCallError,
    RuntimeNotFound,
    RuntimeUnavailable,
    from_rpc_error,
)


@pytest.mark.parametrize(("given", "want"), [
    ("/run/x.sock", "unix:///run/x.sock"),
    ("unix:/run/x.sock", "unix:///run/x.sock"),
    ("unix:///run/x.sock", "unix:///run/x.sock"),
])
def test_unix_target(given: str, want: str) -> None:
    assert unix_target(given) == want


def _err(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom")


def test_error_mapping() -> None:
    assert isinstance(from_rpc_error(_err(grpc.StatusCode.UNAVAILABLE), "m"), RuntimeUnavailable)
    assert isinstance(from_rpc_error(_err(grpc.StatusCode.NOT_FOUND), "m"), RuntimeNotFound)
    other = from_rpc_error(_err(grpc.StatusCode.PERMISSION_DENIED), "Images.Get")
    assert type(other) is RuntimeCallError
    assert other.code == grpc.StatusCode.PERMISSION_DENIED and other.details == "boom"
    assert "Images.Get" in str(other)


async def test_missing_socket_is_unavailable(tmp_path: Path) -> None:
    sock = str(tmp_path / "nothing.sock")
    async with CRIClient(sock, timeout=2) as cri:
        with pytest.raises(RuntimeUnavailable):
            await cri.version()
    async with ContainerdClient(sock, timeout=2) as ctd:
        with pytest.raises(RuntimeUnavailable):
            await ctd.list_statuses()
        assert ctd.rpc_count == 1


def test_ingest_ref_parsing() -> None:
    s = IngestStatus("layer-sha256:abc", 1, 2, 0.0, 0.0, "")
    assert (s.kind, s.digest) == ("layer", "sha256:abc")
    assert IngestStatus("weird", 0, 0, 0.0, 0.0, "").digest == ""
    assert IngestStatus("x-y", 0, 0, 0.0, 0.0, "sha256:e").digest == "sha256:e"
