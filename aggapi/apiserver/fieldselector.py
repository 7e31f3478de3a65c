"""Field selectors in kube-apiserver's grammar (k8s.io/apimachinery ``fields``), parsed
once per request: authorization (a list of one ``metadata.name`` is checked for that
name) and the collections' filtering both read this one result, so no selector can be
authorized for one object and match others.

The grammar: terms split on commas not escaped by a backslash; each term is
``field=value``, ``field==value`` or ``field!=value``, split at the first operator;
in a value, ``\\``, ``\\,`` and ``\\=`` stand for ``\\``, ``,`` and ``=``, and a bare
``,`` or ``=`` or any other escape is an error. No parentheses, no sets, no spaces
trimmed. Anything else is a 400, as kube-apiserver answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggapi.status import StatusError

_OPERATORS = ("!=", "==", "=")  # "==" before "=", so no "=" is left on the value


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str  # unescaped
    equal: bool  # "=" or "==" (False: "!=")


def _bad(message: str) -> StatusError:
    return StatusError(400, message)


def _split_terms(raw: str) -> list[str]:
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(raw):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(raw[start:i])
            start = i + 1
    terms.append(raw[start:])
    return terms


def _unescape(value: str) -> str:
    if not any(c in value for c in "\\,="):
        return value
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise _bad(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise _bad(f"invalid field selector: unescaped character in value: {ch}")
        else:
            out.append(ch)
    if escaped:
        raise _bad("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _term(raw: str, term: str) -> FieldTerm:
    for i in range(len(term)):
        for op in _OPERATORS:
            if term.startswith(op, i):
                return FieldTerm(term[:i], _unescape(term[i + len(op):]), op != "!=")
    raise _bad(f"invalid selector: '{raw}'; can't understand '{term}'")


def parse(raw: str) -> tuple[FieldTerm, ...]:
    """The terms of ``raw`` (empty terms skipped), sorted as kube-apiserver sorts
    them; 400 for a malformed one. Which fields exist is the resource's to say."""
    return tuple(_term(raw, t) for t in sorted(_split_terms(raw)) if t)


def exact_match(terms: tuple[FieldTerm, ...], field: str) -> str | None:
    """The value ``field`` must equal (the first such term), as RequiresExactMatch."""
    return next((t.value for t in terms if t.field == field and t.equal), None)
