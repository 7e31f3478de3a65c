"""``imageref.parse`` is shared per distinct reference (a cluster's objects parse the
same few references over and over), bounded, and never remembers a failure."""

from __future__ import annotations

import pytest

from aggapi import imageref


def test_one_parse_per_reference_is_shared_and_the_memory_bounded() -> None:
    a = imageref.parse("busybox")
    assert a is imageref.parse("busybox")
    assert str(a) == "docker.io/library/busybox:latest"
    assert imageref.parse.cache_info().maxsize == imageref.PARSE_CACHE
    for i in range(imageref.PARSE_CACHE + 10):
        imageref.parse(f"registry.test/app-{i}:v1")
    assert imageref.parse.cache_info().currsize == imageref.PARSE_CACHE


def test_an_invalid_reference_fails_every_time() -> None:
    for _ in range(2):
        with pytest.raises(imageref.InvalidReference):
            imageref.parse("Bad Ref")
