"""The rich view in-process: aggregate arithmetic and the final 100% at every granularity."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from aggapi.plugins.render import Aggregate, RichPullView


def obj(layer: str, n: int, total: int, phase: str = "Downloading") -> dict[str, object]:
    return {"kind": "Progress", "container": "c", "image": "i", "layer": layer, "progress": n,
            "total": total, "phase": phase, "bytesPerSecond": 10.0, "etaSeconds": 1.0}


def test_aggregate_needs_every_total() -> None:
    agg = Aggregate()
    agg.update(obj("a", 50, 100))
    agg.update(obj("b", 25, 100))
    # the ETA of the sum is its last row's (each row's server ETA is 1 s here)
    assert agg.totals() == (75, 200, 20.0, 1.0)
    agg.update(obj("c", 5, -1))
    assert agg.totals()[1] is None


def test_an_images_row_gives_way_to_its_layers() -> None:
    """An image's row (sent before its manifest was known, or standing for layers the
    server holds back in a re-pull) has no total: once its layers come, the sum is
    theirs. Failed at integ2 (CI): the plugin's total read 0 B through a whole re-pull."""
    agg = Aggregate()
    agg.update({**obj("", 0, -1, "Pulling"), "progress": None, "total": None})
    assert agg.totals()[1] is None
    agg.update(obj("a", 50, 100))
    agg.update(obj("b", 25, 100))
    assert agg.totals() == (75, 200, 20.0, 1.0)


@pytest.mark.parametrize("granularity", ["layer", "pod"])
def test_summary_ends_at_100(granularity: str) -> None:
    buf = io.StringIO()
    view = RichPullView(granularity, Console(file=buf, force_terminal=True, width=150))
    view.update(obj("" if granularity == "pod" else "a", 30, 100))
    view.update({"kind": "Summary", "phase": "Done", "progress": 100, "total": 100,
                 "images": []})
    view.close()
    tasks = view.progress.tasks
    assert tasks[0].percentage == 100  # the total row (first), or the pod's one row
    assert "100%" in buf.getvalue()
