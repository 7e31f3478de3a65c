"""Push blobs, manifests, images and indexes to a registry over plain HTTP (blocking; the
``a*`` wrappers run it in a thread) (tests.framework.oci)."""

from __future__ import annotations

import asyncio
import http.client
import urllib.parse
from dataclasses import dataclass, field

from tests.framework.ocitypes import CHUNK, Blob, Image, Index


def _conn(registry: str) -> http.client.HTTPConnection:
    host = registry.removeprefix("http://").rstrip("/")
    return http.client.HTTPConnection(host, timeout=120, blocksize=CHUNK)


def _check(resp: http.client.HTTPResponse, ok: tuple[int, ...], what: str) -> bytes:
    body = resp.read()
    if resp.status not in ok:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {body[:500]!r}")
    return body


def push_blob(registry: str, repo: str, blob: Blob) -> None:
    """Monolithic upload (POST then PUT ?digest=), streamed from the file."""
    conn = _conn(registry)
    try:
        conn.request("HEAD", f"/v2/{repo}/blobs/{blob.digest}")
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            return
        conn.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Content-Length": "0"})
        resp = conn.getresponse()
        _check(resp, (202,), f"start upload {blob.digest}")
        loc = urllib.parse.urlsplit(resp.headers["Location"])
        q = [*urllib.parse.parse_qsl(loc.query), ("digest", blob.digest)]
        target = f"{loc.path}?{urllib.parse.urlencode(q)}"
        with blob.open() as body:
            conn.request("PUT", target, body=body,
                         headers={"Content-Length": str(blob.size),
                                  "Content-Type": "application/octet-stream"})
            _check(conn.getresponse(), (201,), f"upload {blob.digest}")
    finally:
        conn.close()


def push_manifest(registry: str, repo: str, ref: str, blob: Blob) -> None:
    conn = _conn(registry)
    try:
        conn.request("PUT", f"/v2/{repo}/manifests/{ref}", body=blob.read(),
                     headers={"Content-Type": blob.media_type})
        _check(conn.getresponse(), (201,), f"put manifest {repo}:{ref}")
    finally:
        conn.close()


def push_image(registry: str, repo: str, image: Image, tag: str | None = None) -> str:
    """Push blobs then the manifest (by digest, and by ``tag`` if given)."""
    for blob in image.blobs():
        push_blob(registry, repo, blob)
    push_manifest(registry, repo, image.digest, image.manifest)
    if tag:
        push_manifest(registry, repo, tag, image.manifest)
    return image.digest


def push_index(registry: str, repo: str, index: Index, tag: str | None = None) -> str:
    for img in index.images:
        push_image(registry, repo, img)
    push_manifest(registry, repo, index.digest, index.index)
    if tag:
        push_manifest(registry, repo, tag, index.index)
    return index.digest


async def apush_image(registry: str, repo: str, image: Image, tag: str | None = None) -> str:
    return await asyncio.to_thread(push_image, registry, repo, image, tag)


async def apush_index(registry: str, repo: str, index: Index, tag: str | None = None) -> str:
    return await asyncio.to_thread(push_index, registry, repo, index, tag)


@dataclass
class PushedImage:
    """Where a test image lives: ``ref`` is what CRI PullImage takes."""

    ref: str  # host:port/repo:tag
    image: Image | None = None
    index: Index | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        if self.index is not None:
            return self.index.digest
        assert self.image is not None
        return self.image.digest
