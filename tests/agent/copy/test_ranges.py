"""Range header parsing."""

from __future__ import annotations

import pytest

from aggapi.agent.copy.ranges import parse_range
from aggapi.status import StatusError


@pytest.mark.parametrize(("header", "want"), [
    (None, None), ("bytes=0-", (0, 9)), ("bytes=4-", (4, 9)), ("bytes=2-5", (2, 5)),
    ("bytes=2-500", (2, 9)), ("bytes=-3", (7, 9)), ("bytes=-30", (0, 9)),
    ("bytes=5-2", None), ("items=0-1", None), ("bytes=0-1,3-4", None), ("bytes=x-", None),
])
def test_parse_range(header: str | None, want: tuple[int, int] | None) -> None:
    assert parse_range(header, 10) == want


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=-0", "bytes=99-100"])
def test_unsatisfiable(header: str) -> None:
    with pytest.raises(StatusError) as err:
        parse_range(header, 10)
    assert err.value.code == 416 and err.value.headers["Content-Range"] == "bytes */10"


def test_if_range_mismatch_means_whole_file() -> None:
    assert parse_range("bytes=4-", 10, if_range='"old"', current_etag='"new"') is None
    assert parse_range("bytes=4-", 10, if_range='"new"', current_etag='"new"') == (4, 9)
