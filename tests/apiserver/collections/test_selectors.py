"""Label and field selectors as kube-apiserver reads them."""

from __future__ import annotations

import pytest

from aggapi.apiserver import fieldselector
from aggapi.apiserver.collections.podimagepulls import FIELDS
from aggapi.apiserver.collections.selectors import selector
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
