"""Arbitrary small file trees for the directory-copy property tests (both directions):
a hypothesis strategy, writing one to disk, reading one back, and where each regular
file's data sits in a tar, and how many bytes of it were read."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import strategies as st

NAMES = st.sampled_from(["a", "b", "c", "dé", "x" * 120, "sp ace"])
# Mostly small files, some empty, a few past a MiB (the two-read paths).
DATA = st.one_of(st.binary(max_size=3000), st.binary(max_size=3000), st.just(b""),
                 st.integers(1, 5).map(lambda n: bytes([n]) * ((1 << 20) + n * 777)))


@st.composite
def trees(draw: st.DrawFn, min_files: int = 0) -> dict[str, bytes]:
    """{relative path: data}; no path is a file and another's parent at once."""
    paths = draw(st.lists(st.lists(NAMES, min_size=1, max_size=3).map("/".join),
                          min_size=min_files, max_size=6, unique=True))
    out: dict[str, bytes] = {}
    for p in sorted(paths, key=len):
        if not any(p.startswith(q + "/") for q in out):
            out[p] = draw(DATA)
    for p in list(out):
        if any(q.startswith(p + "/") for q in out):
            del out[p]
    return out


def write_tree(root: Path, tree: dict[str, bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by relative path (directories implied)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for n in files:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def data_spans(raw: bytes) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every non-empty regular file's data in the tar ``raw``."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        return [(m.name, m.offset_data, m.size) for m in tf.getmembers()
                if m.isreg() and m.size]


def pax_records(raw: bytes) -> dict[str, dict[str, str]]:
    """Each member's PAX records (global ones included, as tarfile merges them)."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        return {m.name: dict(m.pax_headers) for m in tf.getmembers()}


class PreadCounter:
    """The bytes ``os.pread`` returns while installed: how often a file was read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real = os.pread

        def counted(fd: int, n: int, off: int) -> bytes:
            got = real(fd, n, off)
            self.bytes += len(got)
            return got

        monkeypatch.setattr(os, "pread", counted)
