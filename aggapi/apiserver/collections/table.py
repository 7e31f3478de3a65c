"""Server-side Table output (meta.k8s.io v1 and v1beta1), as kubectl asks for it.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...,
application/json`` and prints the columns the server defines; ``includeObject``
(None, Metadata — the default — or Object) says what each row carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aggapi.status import StatusError

TABLE_VERSIONS = ("v1", "v1beta1")
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
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": list(columns),
            "rows": [_row(o, cells, version, include) for o in objs]}
