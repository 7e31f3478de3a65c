"""The tar writer (``aggapi.tar.stream.header``), checked against Python's own tarfile
reader: whatever the name, size, ids, mode and mtime, the entry reads back the same
(the ustar block built in one join since issue 27 must keep every field and checksum),
and ``header_size`` predicts its length without building it."""

from __future__ import annotations

import io
import tarfile

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.tar.stream import DIR, END, REG, SYM, header, header_size, pad

NAME = st.text(st.characters(codec="utf-8", exclude_characters="\0/"), min_size=1,
               max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parts=st.lists(NAME, min_size=1, max_size=6),
       kind=st.sampled_from([REG, DIR, SYM]),
       size=st.sampled_from([0, 1, 511, 512, 4096, 8 ** 11 - 1]) | st.integers(0, 1 << 20),
       mode=st.integers(0, 0o7777),
       uid=st.sampled_from([0, 1000, 8 ** 7 - 1, 8 ** 7, 1 << 31]),
       gid=st.sampled_from([0, 1000, 8 ** 7 - 1, 8 ** 7]),
       mtime_ns=st.integers(-(1 << 40), 1 << 45) | st.sampled_from([0, (8 ** 11 - 1) * 10 ** 9]),
       link=NAME)
def test_headers_read_back_by_tarfile(parts: list[str], kind: bytes, size: int, mode: int,
                                      uid: int, gid: int, mtime_ns: int, link: str) -> None:
    name = "/".join(parts)
    size = size if kind == REG and size <= 1 << 20 else 0  # data really follows
    linkname = link if kind == SYM else ""
    head = header(name, kind, size=size, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns,
                  linkname=linkname)
    # An upload's Content-Length is the sum of these, computed before any is built.
    assert header_size(name, size=size, uid=uid, gid=gid, mtime_ns=mtime_ns,
                       linkname=linkname) == len(head)
    blob = head + b"d" * size + pad(size) + END
    with tarfile.open(fileobj=io.BytesIO(blob), encoding="utf-8",
                      errors="surrogateescape") as tf:
        (m,) = tf.getmembers()
    assert m.name == name
    assert m.type == kind
    assert (m.size, m.mode, m.uid, m.gid) == (size, mode, uid, gid)
    assert m.linkname == linkname
    sec, ns = divmod(mtime_ns, 10 ** 9)
    assert abs(m.mtime - (sec + ns / 10 ** 9)) < 1e-6 * max(1, abs(sec) / 1e9)
