"""Label and field selectors as kube-apiserver reads them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver import fieldselector
from aggapi.apiserver.collections import watch
from aggapi.apiserver.collections.podimagepulls import FIELDS
from aggapi.apiserver.collections.selectors import Selector, selector
from aggapi.apiserver.collections.store import Event
from aggapi.status import StatusError


def _obj(labels: dict[str, str], node: str = "n1") -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels},
            "spec": {"nodeName": node}}


@pytest.mark.parametrize(("raw", "labels", "want"), [
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "db"}, False),
    ("app!=web", {}, True),
    ("app in (web, db),tier", {"app": "db", "tier": "1"}, True),
    ("app in (web, db),tier", {"app": "db"}, False),
    ("app notin (web)", {"app": "db"}, True),
    ("!canary", {"canary": "x"}, False),
    ("example.com/team=a,!canary", {"example.com/team": "a"}, True),
    ("", {}, True),
])
def test_labels(raw: str, labels: dict[str, str], want: bool) -> None:
    assert selector(raw, (), FIELDS).matches(_obj(labels)) is want


def test_fields() -> None:
    sel = selector("", fieldselector.parse("spec.nodeName=n1,metadata.namespace!=kube-system"),
                   FIELDS)
    assert sel.matches(_obj({})) and not sel.matches(_obj({}, node="n2"))


@pytest.mark.parametrize(("labels", "fields"), [
    ("app in (web", ""), ("a=b=c d", ""), ("_x=y", ""), ("", "spec.schedulerName=x"),
    ("", "metadata.name"),
])
def test_bad_is_400(labels: str, fields: str) -> None:
    with pytest.raises(StatusError) as err:
        selector(labels, fieldselector.parse(fields), FIELDS)
    assert err.value.code == 400


# --- a watcher of everything: each change's type without matching (watch.py) ----------

_objs = st.none() | st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]),
                                       "labels": st.dictionaries(st.sampled_from(["app"]),
                                                                 st.sampled_from(["x", "y"]))})})


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), obj=_objs, prev=_objs)
def test_a_selector_of_everything_sees_each_change_as_its_matching_would(
        kind: str, obj: dict[str, Any] | None, prev: dict[str, Any] | None) -> None:
    ev = Event(1, kind, obj or {"metadata": {"name": "a"}}, prev)
    assert watch._seen_by_all(ev) == watch._seen_as(ev, Selector())
