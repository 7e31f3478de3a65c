"""``bench_kubectl_cp --installed``: the scenarios, their payloads and the digests that
check each transfer, and where the files live (``--target-fs``)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from benchmarks._sourcetree import file_sha, source_tree

MiB = 1 << 20
GiB = 1 << 30
TARGET_FS_TEXT = {
    "fresh": "a fresh journaled ext4 per transfer, both sides (loop images)",
    "rootfs": "the container's overlay rootfs and this host's root fs"}


@dataclass(frozen=True)
class Scenario:
    name: str
    files: int
    file_bytes: int

    @property
    def total(self) -> int:
        return self.files * self.file_bytes

    @property
    def is_dir(self) -> bool:
        return self.name != "big"


def scenarios(size_mib: int, small_files: int, medium_files: int,
              chosen: list[str]) -> list[Scenario]:
    every = {"big": Scenario("big", 1, size_mib * MiB),
             "small": Scenario("small", small_files, 4096),
             "medium": Scenario("medium", medium_files, 10 * MiB)}
    return [every[c] for c in chosen]


# --- payloads and their digests ------------------------------------------------------

def tree_digest(lines: dict[str, str]) -> str:
    """One digest of a tree: sha256 over sorted ``relpath sha256`` lines."""
    text = "".join(f"{p} {d}\n" for p, d in sorted(lines.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def local_digest(path: Path) -> str:
    if path.is_file():
        return file_sha(path)
    return tree_digest({str(f.relative_to(path)): file_sha(f)
                        for f in path.rglob("*") if f.is_file()})


def make_payload(sc: Scenario, workdir: Path) -> Path:
    """The scenario's source: a file, or a tree (100 files per directory)."""
    if not sc.is_dir:
        path = workdir / "big.bin"
        with path.open("wb") as f:
            left = sc.file_bytes
            while left:
                chunk = os.urandom(min(left, 8 * MiB))
                f.write(chunk)
                left -= len(chunk)
        return path
    return source_tree(workdir / sc.name, sc.files, sc.file_bytes)
