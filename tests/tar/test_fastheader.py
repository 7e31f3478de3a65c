"""The compiled header builders (aggapi/tar/_fastheader.c) against the Python ones in
aggapi.tar.stream, their reference: the same bytes for any entry, and the same error
for a name that cannot be encoded; out-of-range numbers go to the Python path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.tar import stream

pytestmark = pytest.mark.skipif(stream._native is None,
                                reason="aggapi.tar._fastheader is not built here")

NUMS = st.one_of(st.integers(0, 8 ** 7 + 2), st.integers(-3, 2 ** 40),
                 st.sampled_from([0, 8 ** 7 - 1, 8 ** 7, 8 ** 11 - 1, 8 ** 11, -1]))
# Text as the walk's names are: any code point, lone surrogates included (most encode
# with surrogateescape, others raise there).
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=120)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=130), st.binary(max_size=2), NUMS, NUMS, NUMS, NUMS, NUMS,
       st.binary(max_size=130))
def test_ustar_blocks_are_the_same(name: bytes, typeflag: bytes, size: int, mode: int,
                                   uid: int, gid: int, mtime: int, link: bytes) -> None:
    assert stream._native is not None
    fast = stream._native.ustar(name, typeflag, size, mode, uid, gid, mtime, link)
    fits = min(size, mode, uid, gid, mtime) >= 0 and max(mode, uid, gid) < 8 ** 7 \
        and max(size, mtime) < 8 ** 11
    if not fits:
        assert fast is None  # the Python path's
        return
    assert fast == stream._ustar_py(name, typeflag, size, mode, uid, gid, mtime, link)
    assert stream._ustar(name, typeflag, size, mode, uid, gid, mtime, link) == fast


def _either(fn: Any, arg: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(arg)
    except Exception as exc:  # the same type and text both ways
        return type(exc).__name__, str(exc)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(TEXT, TEXT, max_size=5))
def test_pax_records_are_the_same(records: dict[str, str]) -> None:
    assert stream._native is not None
    want = _either(stream._records_py, records)
    assert _either(stream._records, records) == want
    if want[0] == "ok":  # (an unencodable name goes to the reference for its error)
        assert stream._native.records(records) == want[1]


@pytest.mark.parametrize("n", [1, 5, 6, 7, 8, 90, 91, 92, 93, 994, 995, 996, 997, 998])
def test_record_lengths_across_a_digit(n: int) -> None:
    """A record's length counts its own digits: the lengths where one more digit
    changes it."""
    assert stream._native is not None
    recs = {"k": "v" * n}
    assert stream._native.records(recs) == stream._records_py(recs)


@pytest.mark.parametrize("n", [0, 1, 99, 100, 101, 255])
def test_names_and_links_at_the_field_width(n: int) -> None:
    """A field of 100 bytes: names and links up to it and past it (cut)."""
    assert stream._native is not None
    name, link = bytes(range(1, 256))[:n], b"L" * n
    args = (name, b"2", 0, 0o777, 1, 2, 3, link)
    assert stream._native.ustar(*args) == stream._ustar_py(*args)
