"""What a test scripts on the fake cluster (tests.client.fakeserver): its pods, progress
sessions, tokens, the recorded requests, and the faults it plays."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from aggapi.tls import pki


@dataclass
class Session:
    """One scripted progress connection: objects, then ``cut``, ``clean`` end or ``hold``."""

    objects: list[dict[str, Any]]
    end: str = "clean"
    delay: float = 0.0


@dataclass
class Pod:
    containers: dict[str, Path]
    cwd: str = "/"  # the containers' working directory: relative copy paths start there
    annotations: dict[str, str] = field(default_factory=dict)

    def manifest(self, ns: str, name: str) -> dict[str, Any]:
        """The core v1 Pod object (GET /api/v1/.../pods/NAME) for completion and
        container defaulting."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "annotations": self.annotations},
                "spec": {"containers": [{"name": c} for c in self.containers]}}



@dataclass
class FakeClusterState:
    """FakeCluster's fields (tests.client.fakeserver) and its CA."""

    tmp: Path
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    sessions: list[Session] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    cut_download_after: int | None = None  # the next file GET is cut after N bytes
    cut_upload_after: int | None = None  # the next upload is cut after N body bytes
    download_delay: float = 0.0  # per 64 KiB chunk, to let a test interrupt a transfer
    corrupt_sha: bool = False
    # As agents before sha256=trailer: any sha256 but 64 hex digits is refused.
    no_sha256_trailer: bool = False
    # As agents before the headers digest (sha256=headers...): refused as above.
    no_headers_digest: bool = False
    # As agents before digest=trailer: a file's sha256 always goes up front.
    no_download_trailer: bool = False
    # A digest=trailer reply framed badly: "short" (Content-Length below the trailer's
    # 32 bytes), "extra" (5 bytes more than the file and trailer), "cut" (the body ends
    # inside the trailer).
    trailer_framing: str = ""
    # Flip this byte of a digest=trailer body (an offset into it, data then trailer).
    flip_byte: int | None = None
    # As 622964a's agent: a symlink download is answered with the link whatever the query.
    symlinks_regardless: bool = False
    dir_tar: bytes | None = None  # served instead of a real directory tar
    dir_stall_after: int | None = None  # a directory GET stops after N bytes, forever
    workloads: dict[str, list[str]] = field(default_factory=dict)  # "deployments": names
    port: int = 0

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.ca = pki.new_ca("fake-cluster-ca")
        self.serving = pki.issue(self.ca, "fake-apiserver", server=True, ips=["127.0.0.1"])
        self.ca_file = self.tmp / "ca.crt"
        pki.write_file(self.ca_file, self.ca.cert_pem)
        self._runner: web.AppRunner | None = None

