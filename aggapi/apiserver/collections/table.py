"""Server-side Table output (meta.k8s.io v1 and v1beta1), as kubectl asks for it.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...,
application/json`` and prints the columns the server defines; ``includeObject``
(None, Metadata — the default — or Object) says what each row carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from aggapi.status import StatusError

TABLE_VERSIONS = ("v1", "v1beta1")
AGE_COLUMN: dict[str, Any] = {
    "name": "Age", "type": "string", "format": "", "priority": 0,
    "description": "Time since the object was created (metadata.creationTimestamp)"}
INCLUDE = ("None", "Metadata", "Object")
_JSON = ("application/json", "application/*", "*/*")


def _media(part: str) -> tuple[str, dict[str, str]]:
    kind, *params = [p.strip() for p in part.split(";")]
    out = {}
    for p in params:
        k, _, v = p.partition("=")
        out[k.strip().lower()] = v.strip().strip('"')
    return kind.lower(), out


def table_version(accept: str) -> str | None:
    """The Table version the Accept header asks for first; None for plain objects.
    406 when it accepts nothing this server writes."""
    if not accept.strip():
        return None
    for part in accept.split(","):
        kind, params = _media(part)
        if kind not in _JSON:
            continue
        as_ = params.get("as")
        if as_ is None:
            return None
        if (as_ == "Table" and params.get("g") == "meta.k8s.io"
                and params.get("v") in TABLE_VERSIONS):
            return params["v"]
    raise StatusError(406, f"only application/json, as plain objects or as Table "
                           f"(meta.k8s.io {', '.join(TABLE_VERSIONS)}), is served; "
                           f"Accept was {accept!r}")


def include_object(query: Mapping[str, str]) -> str:
    value = query.get("includeObject") or "Metadata"
    if value not in INCLUDE:
        raise StatusError(400, f"includeObject must be one of {', '.join(INCLUDE)}")
    return value


def _row(obj: Mapping[str, Any], cells: Callable[[Mapping[str, Any]], list[Any]],
         version: str, include: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": cells(obj)}
    if include == "Object":
        row["object"] = obj
    elif include == "Metadata":
        row["object"] = {"kind": "PartialObjectMetadata",
                         "apiVersion": f"meta.k8s.io/{version}",
                         "metadata": obj.get("metadata") or {}}
    return row


def table(objs: Sequence[Mapping[str, Any]], columns: Sequence[Mapping[str, Any]],
          cells: Callable[[Mapping[str, Any]], list[Any]], *, version: str, include: str,
          resource_version: str) -> dict[str, Any]:
    row = row_of(cells, version, include)
    return {**table_envelope(columns, version, resource_version),
            "rows": [row(o) for o in objs]}


def table_envelope(columns: Sequence[Mapping[str, Any]], version: str,
                   resource_version: str) -> dict[str, Any]:
    """A Table without its rows (a big list streams them after)."""
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": list(columns)}


def row_of(cells: Callable[[Mapping[str, Any]], list[Any]], version: str,
           include: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """An object's Table row."""
    return lambda obj: _row(obj, cells, version, include)


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages (apimachinery's HumanDuration): the two most
    telling units while short, one when long."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def age(obj: Mapping[str, Any], now: float | None = None) -> str:
    """The AGE cell: time since metadata.creationTimestamp, or <unknown>."""
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        created = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "<unknown>"
    return human_duration((time.time() if now is None else now) - created)
