"""Symlinks checked again once a directory's stream ended: a later entry can change
what an earlier link's path runs through (:mod:`aggapi.client.extractor`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from aggapi.client.confine import resolve_beneath

if TYPE_CHECKING:
    from aggapi.client.extractor import Extractor

RECHECK_ROUNDS = 4


def recheck_links(ex: Extractor) -> None:
    """Remove every symlink that now leads outside, until none does.

    A link checked when it was created can leave the tree once a later entry
    put a link into its path (``l -> s/x/../..`` with ``s -> .`` after it), and a
    removal can change what another link's path runs through: check again. A
    hostile chain could make that quadratic, so after a few rounds every link
    whose path runs through another link goes too; the rest cannot change.
    Called only when the stream made a symlink (``links``): without one there is
    nothing to walk for."""
    for rounds in range(RECHECK_ROUNDS + 1):
        if not _sweep(ex, strict=rounds == RECHECK_ROUNDS):
            return


def _sweep(ex: Extractor, strict: bool) -> bool:
    removed = False
    for cur, dirs, files in os.walk(ex.tmp):
        rel = list(Path(cur).relative_to(ex.tmp).parts)
        for name in dirs + files:
            path = os.path.join(cur, name)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            found = resolve_beneath(ex.root, rel, target, max_links=0 if strict else None)
            if found is None:
                os.unlink(path)
                removed = True
                ex.result.entries -= 1
                why = ("runs through another link" if strict else
                       "points outside the destination through a later entry")
                ex.result.refused.append(
                    f"symlink {'/'.join([*rel, name])!r} -> {target!r} {why}; removed")
    return removed
