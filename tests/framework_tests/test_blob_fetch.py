"""BlobFetch (tests.framework.throttle): body bytes counted without the response head,
whatever the write boundaries, and memory bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.framework.throttle import MAX_SAMPLES, BlobFetch

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDocker-Content-Digest: sha256:ab\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n")


@given(body=st.integers(0, 300_000), cuts=st.lists(st.integers(1, 65536), max_size=40))
def test_counts_body_only_across_any_write_boundaries(body: int, cuts: list[int]) -> None:
    stream = HEAD + b"x" * body
    f = BlobFetch("sha256:ab", 0.0)
    pos = 0
    for n in [*cuts, len(stream)]:
        f.add(stream[pos:pos + n])
        pos += n
        if pos >= len(stream):
            break
    assert f.received == body
    offsets = [s[2] for s in f.samples]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(o > 0 for o in offsets)


def test_samples_thinned_not_unbounded() -> None:
    f = BlobFetch("sha256:ab", 0.0)
    f.add(HEAD)
    for _ in range(5 * MAX_SAMPLES):
        f.add(b"y" * 10)
    assert len(f.samples) < MAX_SAMPLES
    assert f.received == 50 * MAX_SAMPLES  # the last sample survives the thinning
    assert f.samples[0][2] == 10        # and the first
