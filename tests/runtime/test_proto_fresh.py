"""The committed stubs must match what hack/gen-proto.sh makes from the .proto files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.framework.repo import REPO

PROTO = REPO / "aggapi" / "proto"
# Lines that only record the generator's version, not the schema.
VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,)$", re.M)


def _normalise(text: str) -> str:
    return VERSION_LINES.sub("", text)


def test_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run(["bash", str(REPO / "hack" / "gen-proto.sh"), str(tmp_path)], check=True)
    fresh = {p.name: p for p in tmp_path.iterdir() if p.is_file()}
    committed = {p.name: p for p in PROTO.iterdir()
                 if p.is_file() and re.search(r"_pb2(_grpc)?\.pyi?$", p.name)}
    assert sorted(fresh) == sorted(committed), "stub set differs: run hack/gen-proto.sh"
    stale = [n for n in fresh
             if _normalise(fresh[n].read_text()) != _normalise(committed[n].read_text())]
    assert not stale, f"stale stubs {stale}: run hack/gen-proto.sh"


def test_stubs_import_package_relative() -> None:
    for p in PROTO.glob("*_pb2*.py"):
        assert not re.search(r"^import \w+_pb2", p.read_text(), re.M), p.name
