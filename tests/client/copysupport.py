"""Shared by the copy tests: the fake cluster's pod, its paths, a payload, a tree's
contents, and the hostile tars (tests/plugins/test_ncp.py uses them too)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from aggapi.client.copy import RemotePath
from aggapi.tar.stream import BLK, DIR, LNK, PAX, REG, SYM, header, pad, pax_header
from tests.client.fakeserver import FakeCluster

PAYLOAD = os.urandom(700_000)


def app_root(cluster: FakeCluster) -> Path:
    return cluster.pods[("default", "web")].containers["app"]


def rp(path: str) -> RemotePath:
    return RemotePath("default", "web", path, "app")


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def tree(d: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for cur, dirs, files in os.walk(d):
        for n in dirs + files:
            p = Path(cur, n)
            rel = str(p.relative_to(d))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o777)
    return out


def evil(entries: bytes, complete: bool = True) -> bytes:
    out = entries
    if complete:
        out += pax_header("./", {"AGGAPI.complete": "true"}, typeflag=PAX) + header("./", DIR)
    return out + b"\0" * 1024


def reg(name: str, data: bytes = b"x") -> bytes:
    return header(name, REG, size=len(data)) + data + pad(len(data))


HOSTILE = {
    "absolute": evil(reg("/tmp/owned")),
    "dotdot": evil(reg("../owned")),
    "inner-dotdot": evil(header("a/", DIR) + reg("a/../../owned")),
    "abs-symlink": evil(header("l", SYM, linkname="/etc")),
    "escaping-symlink": evil(header("d/", DIR) + header("d/l", SYM, linkname="../../x")),
    "write-through-symlink": evil(header("s/", DIR) + header("l", SYM, linkname="s")
                                  + reg("l/x")),
    "hardlink-outside": evil(header("h", LNK, linkname="/etc/passwd")),
    "device": evil(header("dev", BLK)),
    "truncated": evil(reg("ok"), complete=False),
}
