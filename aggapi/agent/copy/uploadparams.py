"""The options of one upload, as the copy handlers parsed them from the request and
its capability (aggapi.agent.copy.handlers.upload_params)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aggapi.agent.copy.atomic import Owner


@dataclass(frozen=True)
class UploadParams:
    overwrite: bool = True
    owner: Owner = field(default_factory=Owner)
    sha256: str | None = None
    # The expected sha256 comes as the body's last 32 bytes (wire.SHA256_TRAILER).
    sha256_trailer: bool = False
    # The sha256 (either way) is the tar's headers digest (aggapi.tar.entrydigest).
    sha256_headers: bool = False
    tar: bool = False
