"""Label selectors, parsed as kube-apiserver reads them, and the request's parsed
field selector checked against the resource's fields; a bad one is a 400. The field
selector itself is parsed once, with the request (``apiserver/fieldselector.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.apiserver.fieldselector import FieldTerm
from aggapi.status import StatusError

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*"
                        r"[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_SET_OP = re.compile(r"^\s*(\S+)\s+(in|notin)\s+\((.*)\)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        return not has or value not in self.values  # != and notin


def _terms(raw: str) -> list[str]:
    """Split on commas outside parentheses (a label selector's sets hold commas)."""
    out, depth, cur = [], 0, ""
    for ch in raw:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [t.strip() for t in out if t.strip()]


def _bad(kind: str, raw: str, why: str) -> StatusError:
    return StatusError(400, f"unable to parse requirement: invalid {kind} {raw!r}: {why}")


def _check_key(key: str, raw: str) -> str:
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise _bad("label selector", raw, f"invalid label key {key!r}")
    return key


def _check_value(value: str, raw: str) -> str:
    if not _LABEL_VALUE.match(value) or len(value) > 63:
        raise _bad("label selector", raw, f"invalid label value {value!r}")
    return value


def parse_labels(raw: str) -> tuple[Requirement, ...]:
    out = []
    for term in _terms(raw):
        if m := _SET_OP.match(term):
            values = frozenset(_check_value(v.strip(), raw) for v in m.group(3).split(","))
            out.append(Requirement(_check_key(m.group(1), raw), m.group(2), values))
        elif "!=" in term:
            k, v = term.split("!=", 1)
            out.append(Requirement(_check_key(k.strip(), raw), "!=",
                                   frozenset({_check_value(v.strip(), raw)})))
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            out.append(Requirement(_check_key(k.strip(), raw), "=",
                                   frozenset({_check_value(v.strip(), raw)})))
        elif term.startswith("!"):
            out.append(Requirement(_check_key(term[1:].strip(), raw), "!"))
        else:
            out.append(Requirement(_check_key(term, raw), "exists"))
    return tuple(out)


def check_fields(terms: tuple[FieldTerm, ...],
                 supported: Mapping[str, Callable[[Mapping[str, Any]], str]]
                 ) -> tuple[FieldTerm, ...]:
    """``terms`` (the request's one parse, ``RequestInfo.fields``) if this resource
    has each field; 400 ``field label not supported`` otherwise."""
    for t in terms:
        if t.field not in supported:
            raise StatusError(400, f'field label not supported: {t.field} (supported: '
                                   f'{", ".join(sorted(supported))})')
    return terms


@dataclass(frozen=True)
class Selector:
    """What a list or watch asks for: labels, fields, and the scope's namespace."""
    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldTerm, ...] = ()
    getters: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        getters = self.getters or {}
        return all((getters[t.field](obj) == t.value) == t.equal for t in self.fields)


def selector(label_selector: str, fields: tuple[FieldTerm, ...],
             getters: Mapping[str, Callable[[Mapping[str, Any]], str]]) -> Selector:
    """The request's ``labelSelector`` and its parsed ``fieldSelector``; 400 when
    either is bad."""
    return Selector(parse_labels(label_selector), check_fields(fields, getters), getters)
