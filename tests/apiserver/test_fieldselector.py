"""Field selectors in kube-apiserver's grammar, parsed once for authorization and
filtering: whatever a selector is authorized for is all it can match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.selectors import Selector
from aggapi.apiserver.fieldselector import FieldTerm, parse
from aggapi.apiserver.requestinfo import parse as request_info
from aggapi.status import StatusError

G = "/apis/subresources.aggapi.io/v1alpha1"


@pytest.mark.parametrize(("raw", "terms"), [
    ("", ()),
    ("metadata.name=a", (FieldTerm("metadata.name", "a", True),)),
    ("metadata.name==a", (FieldTerm("metadata.name", "a", True),)),
    ("metadata.name!=a", (FieldTerm("metadata.name", "a", False),)),
    ("metadata.name=", (FieldTerm("metadata.name", "", True),)),
    ("b=1,,a!=2", (FieldTerm("a", "2", False), FieldTerm("b", "1", True))),  # sorted
    (r"x=a\,b\=c\\", (FieldTerm("x", "a,b=c\\", True),)),
    (" x = y", (FieldTerm(" x ", " y", True),)),  # no trimming (then: no such field)
    # parentheses mean nothing: the commas inside them split terms
    ("metadata.namespace!=(,metadata.name=X,a=)", (
        FieldTerm("a", ")", True), FieldTerm("metadata.name", "X", True),
        FieldTerm("metadata.namespace", "(", False))),
])
def test_grammar(raw: str, terms: tuple[FieldTerm, ...]) -> None:
    assert parse(raw) == terms


@pytest.mark.parametrize("raw", [
    "metadata.name", "metadata.name=a=b", r"metadata.name=a\x", "metadata.name=a\\",
    "a in (b)", "metadata.name=a,b",
])
def test_malformed_is_400(raw: str) -> None:
    with pytest.raises(StatusError) as err:
        parse(raw)
    assert err.value.code == 400


GETTERS = {"metadata.name": lambda o: o["metadata"]["name"],
           "metadata.namespace": lambda o: o["metadata"]["namespace"]}
NAMES = ["X", "a", "(", ")", ",", "", "a,b", "X\\"]


@settings(derandomize=True, database=None, max_examples=500)
@given(st.lists(st.sampled_from(["metadata.name", "metadata.namespace", "=", "==", "!=",
                                 ",", "(", ")", "\\", "X", "a"]), max_size=12))
def test_authorized_for_one_name_matches_only_it(tokens: list[str]) -> None:
    raw = "".join(tokens)
    try:
        info = request_info("GET", f"{G}/namespaces/n/podimagepulls", {"fieldSelector": raw})
    except StatusError as err:
        assert err.code == 400
        return
    if not info.name or any(t.field not in GETTERS for t in info.fields):
        return  # authorized for the whole collection, or a 400 in the handler
    sel = Selector((), info.fields, GETTERS)
    for name in NAMES:
        for ns in NAMES:
            if sel.matches({"metadata": {"name": name, "namespace": ns}}):
                assert name == info.name, (raw, info.name, name)
