"""The copy request's query, parsed once: the target (container and path) the
capability must name, and the upload's and the download's options."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from aggapi import wire
from aggapi.agent.copy.atomic import Owner
from aggapi.agent.copy.fsroot import request_path
from aggapi.agent.copy.uploadparams import UploadParams, strict_query
from aggapi.auth.capability import Capability
from aggapi.status import StatusError


def target(request: web.Request, cap: Capability) -> tuple[str, str]:
    """(container name, clean path), both as the capability names them."""
    strict_query(request.method, request.query)
    names = [c.name for c in cap.containers]
    container = request.query.get(wire.PARAM_CONTAINER) or (names[0] if len(names) == 1 else "")
    if not container:
        raise StatusError(400, "container is required")
    if container not in names:
        raise StatusError(403, f'capability does not cover container "{container}"')
    path = request_path(request.query.get(wire.PARAM_PATH))
    if cap.path is None or request_path(cap.path) != path:
        raise StatusError(403, f"capability does not cover path {path!r}")
    return container, path  # relative: resolved once the container is open


def param(request: web.Request, cap: Capability, key: str) -> str | None:
    q = request.query.get(key)
    c = cap.params.get(key)
    if q is not None and c is not None and q != c:
        raise StatusError(403, f"{key}={q!r} differs from the capability's {c!r}")
    if q is not None and c is None and key not in wire.QUERY_ONLY_UPLOAD_PARAMS:
        raise StatusError(403, f"{key} is not authorized by the capability")
    return c if c is not None else q


def upload_params(request: web.Request, cap: Capability) -> UploadParams:
    raw = {k: param(request, cap, k) for k in wire.UPLOAD_PARAMS}
    ow = (raw["overwrite"] or "true").lower()
    if ow not in ("true", "false", "1", "0"):
        raise StatusError(400, "overwrite must be true or false")
    mode = raw["mode"]
    if mode is not None and not re.fullmatch(r"0?[0-7]{1,4}", mode):
        raise StatusError(400, "mode must be octal, at most 07777")
    ids: dict[str, int | None] = {}
    for k in ("uid", "gid"):
        v = raw[k]
        if v is not None and (not v.isdigit() or int(v) > 0xFFFFFFFE):
            raise StatusError(400, f"{k} must be a number")
        ids[k] = int(v) if v is not None else None
    fmt = raw["format"] or "raw"
    if fmt not in ("raw", "tar"):
        raise StatusError(400, "format must be raw or tar")
    if fmt == "tar" and mode is not None:
        raise StatusError(400, "mode= applies to single files only")
    sha, trailer, headers = sha256_claim(raw["sha256"], fmt == "tar")
    return UploadParams(
        overwrite=ow in ("true", "1"),
        owner=Owner(ids["uid"], ids["gid"], int(mode, 8) if mode else None,
                    keep_setid=mode is not None),
        sha256=sha, sha256_trailer=trailer, sha256_headers=headers, tar=fmt == "tar")


def sha256_claim(value: str | None, tar: bool) -> tuple[str | None, bool, bool]:
    """sha256= as (hex up front or None, in a trailer, of the tar's headers only)."""
    if value is None:
        return None, False, False
    trailer = value in (wire.SHA256_TRAILER, wire.SHA256_HEADERS_TRAILER)
    headers = value == wire.SHA256_HEADERS_TRAILER \
        or value.startswith(wire.SHA256_HEADERS_PREFIX)
    if headers and not tar:
        raise StatusError(400, "a headers digest (sha256=headers...) applies to format=tar "
                          "only")
    hex_ = None if trailer else value.removeprefix(wire.SHA256_HEADERS_PREFIX)
    if hex_ is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", hex_):
        raise StatusError(400, f"{wire.SHA256_REFUSED}, {wire.SHA256_TRAILER!r}, "
                          f"{wire.SHA256_HEADERS_PREFIX!r} and 64 hex digits, or "
                          f"{wire.SHA256_HEADERS_TRAILER!r}")
    return hex_, trailer, headers


@dataclass(frozen=True)
class DownloadParams:
    # digest=trailer: each file's sha256 follows its data (wire.DIGEST_TRAILER).
    trailer: bool = False
    # digest given (trailer or entry): a directory's tar carries the AGGAPI.* records;
    # without it, a plain tar (aggapi.agent.copy.tarwalk.TarWalker.plain).
    records: bool = False
    # symlink=keep: a symlink at the path is sent as the link itself.
    keep_symlink: bool = False


def download_params(request: web.Request) -> DownloadParams:
    """The download's options, parsed before the container is looked at: a bad value
    is a 400 whatever the path holds."""
    digest = request.query.get(wire.PARAM_DIGEST)
    if digest is not None and digest not in (wire.DIGEST_TRAILER, wire.DIGEST_ENTRY):
        raise StatusError(400, f"{wire.PARAM_DIGEST} must be {wire.DIGEST_TRAILER} or "
                          f"{wire.DIGEST_ENTRY}")
    link = request.query.get(wire.PARAM_SYMLINK)
    if link is not None and link != wire.SYMLINK_KEEP:
        raise StatusError(400, f"{wire.PARAM_SYMLINK} must be {wire.SYMLINK_KEEP}")
    return DownloadParams(trailer=digest == wire.DIGEST_TRAILER, keep_symlink=link is not None,
                          records=digest is not None)
