"""The small-file trees the copy benchmarks send: random files, 100 to a directory,
as in a source tree."""

from __future__ import annotations

import os
from pathlib import Path


def source_tree(root: Path, files: int, size: int) -> Path:
    """``files`` random files of ``size`` bytes under ``root`` (made here), 100 to a
    directory."""
    for i in range(files):
        d = root / f"d{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        (d / f"f{i % 100:02d}.dat").write_bytes(os.urandom(size))
    return root
