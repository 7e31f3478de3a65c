"""Directory downloads checked file by file (issue 27 item 4): the agent's tar carries
each regular file's sha256 as the PAX record AGGAPI.sha256, and ncp checks it before
anything is placed. The tars come from the agent's real walker (tarwalk.TarWalker)
over a real directory, and go through the client's real extract_dir."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import tarwalk as download
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.client.errors import IntegrityError, TransferError
from aggapi.client.extract import ExtractResult, extract_dir
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from tests.filetrees import data_spans, pax_records, read_tree, trees, write_tree

# Every test on both extraction paths (the compiled loop where it is built).
pytestmark = pytest.mark.usefixtures("extract_path")

PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def walk(src: Path, chunk: int = download.CHUNK, *, trailing: bool = False) -> bytes:
    """The agent's download tar of ``src``: each file's digest in its own entry (files
    above ``chunk`` bytes read twice), or with ``trailing`` on the entry after it
    (digest=trailer, each file read once)."""
    saved, download.CHUNK = download.CHUNK, chunk
    root = FsRoot(os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), container_id="t")
    dfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walker = download.TarWalker(root, dfd, CopyLimits(state_dir="/nonexistent"),
                                    trailing=trailing)
        return b"".join(walker.chunks())
    finally:
        download.CHUNK = saved
        os.close(dfd)
        os.close(root.root_fd)


async def _extract(blob: bytes, dest: Path) -> ExtractResult:
    sr = asyncio.StreamReader()
    sr.feed_data(blob)
    sr.feed_eof()
    return await extract_dir(ts.TarReader(sr), dest)


def extract(blob: bytes, dest: Path) -> ExtractResult:
    return asyncio.run(_extract(blob, dest))


def leftovers(parent: Path) -> list[str]:
    return [n for n in os.listdir(parent) if ".ncp-" in n]


@PROPS
@given(trees(), st.sampled_from([4096, 1 << 20]))
def test_any_tree_round_trips_with_a_digest_per_file(tree: dict[str, bytes],
                                                    chunk: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dl-digests-"))
    try:
        write_tree(tmp / "src", tree)
        raw = walk(tmp / "src", chunk)
        recs = pax_records(raw)
        for rel, data in tree.items():
            assert recs[rel]["AGGAPI.sha256"] == hashlib.sha256(data).hexdigest()
        res = extract(raw, tmp / "dst")
        assert res.verified
        assert read_tree(tmp / "dst") == tree
    finally:
        shutil.rmtree(tmp)


@PROPS
@given(trees(min_files=1).filter(lambda t: any(t.values())), st.booleans(), st.data())
def test_any_flipped_data_byte_is_caught_and_nothing_placed(
        tree: dict[str, bytes], trailing: bool, data: st.DataObject) -> None:
    """Whether each digest comes before its file or after it (digest=trailer)."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-digests-"))
    try:
        write_tree(tmp / "src", tree)
        raw = bytearray(walk(tmp / "src", trailing=trailing))
        name, off, size = data.draw(st.sampled_from(data_spans(bytes(raw))))
        raw[off + data.draw(st.integers(0, size - 1))] ^= data.draw(st.integers(1, 255))
        with pytest.raises(IntegrityError, match=re.escape(f"sha256 mismatch for '{name}'")):
            extract(bytes(raw), tmp / "dst")
        assert not os.path.lexists(tmp / "dst")
        assert leftovers(tmp) == []
    finally:
        shutil.rmtree(tmp)


def _file(name: str, data: bytes, records: dict[str, str] | None) -> bytes:
    return ts.header(name, ts.REG, size=len(data), records=records) + data + ts.pad(len(data))


def _end() -> bytes:
    return (ts.pax_header("./", {"AGGAPI.complete": "true"}, typeflag=ts.PAX)
            + ts.header("./", ts.DIR, mode=0o755) + ts.END)


GOOD = record(hashlib.sha256(b"abc").hexdigest())


@pytest.mark.parametrize(("tar", "why"), [
    (ANNOUNCEMENT + _file("ok", b"abc", GOOD) + _file("f", b"abc", None),
     "tar entry 'f' carries no AGGAPI.sha256 record"),
    (ANNOUNCEMENT + _file("f", b"abc", {"AGGAPI.sha256": "0" * 63}),
     "tar entry 'f' has a malformed AGGAPI.sha256 record"),
    (ANNOUNCEMENT + ts.pax_header("p", GOOD, typeflag=ts.PAX) + _file("f", b"abc", GOOD),
     "duplicate PAX record AGGAPI.sha256"),
    (ANNOUNCEMENT + ts.pax_header("g", GOOD) + _file("f", b"abc", None),
     "AGGAPI.sha256 in a global header"),
    (ts.pax_header("g", {"AGGAPI.entryDigests": "sha1"}) + _file("f", b"abc", GOOD),
     "unsupported AGGAPI.entryDigests 'sha1'"),
])
def test_missing_malformed_or_duplicate_record_fails_the_copy(tmp_path: Path, tar: bytes,
                                                              why: str) -> None:
    with pytest.raises(TransferError, match=re.escape(why)):
        extract(tar + _end(), tmp_path / "dst")
    assert os.listdir(tmp_path) == []


def test_an_older_agents_tar_is_accepted_and_says_so(tmp_path: Path) -> None:
    """Mixed versions during an upgrade: an older agent announces nothing and sends no
    records; the copy goes on, and its result says the files were not checked."""
    res = extract(_file("f", b"abc", None) + _end(), tmp_path / "dst")
    assert not res.verified
    assert read_tree(tmp_path / "dst") == {"f": b"abc"}
