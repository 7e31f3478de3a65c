"""Strings held once (``interned``): a held tree equals what was parsed, the parsed one
is not changed, and the mirror's objects share what objects repeat but keep their own
name, uid and version as parsed."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aggapi.apiserver import interned
from aggapi.apiserver.mirror import _parse

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=300),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@given(JSON)
def test_a_held_tree_is_what_was_parsed_and_that_is_not_changed(v: Any) -> None:
    before = copy.deepcopy(v)
    assert interned.tree(v) == before
    assert v == before


def test_the_mirror_holds_the_strings_objects_repeat_once() -> None:
    def line(i: int) -> str:
        return json.dumps({"type": "ADDED", "object": {
            "metadata": {"name": f"web-{i}", "namespace": "ns1", "uid": f"uid-{i}",
                         "resourceVersion": str(10 + i), "labels": {"app": "web"}},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Pulling", "images": [{"image": "registry.test/app:1"}]}}})
    # two batches, as the leader's stream brings them (each its own parse)
    (a,), (b,) = _parse(line(0).encode()), _parse(line(1).encode())
    oa, ob = a["object"], b["object"]
    assert oa["metadata"]["namespace"] is ob["metadata"]["namespace"]
    assert oa["metadata"]["labels"]["app"] is ob["metadata"]["labels"]["app"]
    assert oa["spec"]["nodeName"] is ob["spec"]["nodeName"]
    assert oa["status"]["images"][0]["image"] is ob["status"]["images"][0]["image"]
    assert list(oa) == ["metadata", "spec", "status"]  # the leader's order: same text
    assert oa == json.loads(line(0))["object"]
