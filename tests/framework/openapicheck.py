"""Checks a body against an OpenAPI v2 or v3 definition, strictly: every key the body
carries must be described (a schema that omits what is sent fails as surely as a
body missing what the schema promises), types as OpenAPI names them, null only
where the schema says nullable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    while True:
        if "$ref" in schema:
            schema = defs[str(schema["$ref"]).rsplit("/", 1)[-1]]
        elif "allOf" in schema and len(schema["allOf"]) == 1:
            schema = schema["allOf"][0]
        else:
            return schema


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}


def problems(value: Any, schema: Mapping[str, Any], defs: Mapping[str, Any],
             where: str = "$") -> list[str]:
    """What in ``value`` the schema does not describe or allow (empty: it matches)."""
    nullable = bool(schema.get("x-nullable") or schema.get("nullable"))
    schema = _resolve(schema, defs)
    if value is None:
        ok = nullable or schema.get("x-nullable") or schema.get("nullable")
        return [] if ok else [f"{where}: null where the schema allows none"]
    kind = schema.get("type")
    if kind and not _TYPES[str(kind)](value):
        return [f"{where}: {type(value).__name__} where the schema says {kind}"]
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in schema.get("required") or ():
            if key not in value:
                out.append(f"{where}: lacks required {key!r}")
        for key, v in value.items():
            if key in props:
                out += problems(v, props[key], defs, f"{where}.{key}")
            elif isinstance(extra, Mapping):
                out += problems(v, extra, defs, f"{where}.{key}")
            elif "properties" in schema and extra is not True:
                out.append(f"{where}: {key!r} is not in the schema")
    elif isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += problems(v, schema["items"], defs, f"{where}[{i}]")
    return out


def check(value: Any, name: str, defs: Mapping[str, Any]) -> None:
    found = problems(value, defs[name], defs)
    assert not found, f"{name}: " + "; ".join(found[:10])
