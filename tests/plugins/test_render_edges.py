"""The plugin's rough edges of issue 37: units, the total row's place, layers already
present, changed lines only when piped, one ETA format, and -A's columns."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from aggapi.plugins.pullset import PullSet
from aggapi.plugins.render import PlainPullView, RichPullView
from aggapi.plugins.setview import RichSetView
from tests.plugins.fakecollection import pod_image_pull

MiB = 1 << 20


def layer(digest: str, n: int, total: int, phase: str = "Downloading",
          eta: float | None = 5.0, rate: float | None = 200 * 1024.0) -> dict[str, Any]:
    return {"kind": "Progress", "container": "app", "image": "reg/app:1",
            "layer": f"sha256:{digest * 12}", "progress": n, "total": total,
            "phase": phase, "bytesPerSecond": rate, "etaSeconds": eta}


def rich_text(objs: list[dict[str, Any]], width: int = 200) -> str:
    con = Console(file=io.StringIO(), force_terminal=True, width=width, record=True)
    view = RichPullView("layer", con)
    for o in objs:
        view.update(o)
    view.progress.stop()
    out = Console(file=io.StringIO(), width=width, record=True)
    out.print(view.progress.get_renderable())
    return out.export_text()


def plain_lines(objs: list[dict[str, Any]]) -> list[str]:
    buf = io.StringIO()
    view = PlainPullView("layer", out=buf, err=io.StringIO())
    for o in objs:
        view.update(o)
    return buf.getvalue().splitlines()


def test_sizes_use_the_rates_binary_units() -> None:
    text = rich_text([layer("a", 5 * MiB, 10 * MiB)])
    assert "5.0/10.0 MiB" in text, text
    assert "200.0 KiB/s" in text, text
    assert " MB" not in text, text


def test_total_row_comes_first() -> None:
    text = rich_text([layer("a", MiB, 2 * MiB), layer("b", MiB, 4 * MiB),
                      layer("c", 0, 8 * MiB)])
    rows = [ln.strip() for ln in text.splitlines() if ln.strip()]
    assert rows[0].startswith("total"), text
    assert [r.split()[2] for r in rows[1:]] == ["a" * 12, "b" * 12, "c" * 12], text


def test_layer_already_on_the_node_shows_already_present() -> None:
    # During a re-pull the server holds a present layer at Pulling (kubelet pulls
    # again, the runtime has not said more): all its bytes are on the node.
    o = layer("a", 3 * MiB, 3 * MiB, phase="Pulling", eta=None, rate=None)
    (line,) = plain_lines([o])
    assert "AlreadyPresent" in line and "Pulling" not in line, line
    text = rich_text([o])
    assert "AlreadyPresent" in text and "Pulling" not in text, text


def test_piped_view_prints_only_changes() -> None:
    a = layer("a", MiB, 4 * MiB)
    lines = plain_lines([a, {**a, "time": "later"}, a, {**a, "progress": 2 * MiB}, a])
    assert len(lines) == 3, lines


def test_one_eta_format_for_pipe_and_terminal() -> None:
    # About 1 MiB left: the pipe used to read 0:00:00 where the terminal said 0:00:03.
    o = layer("a", 9 * MiB, 10 * MiB, eta=0.4, rate=350 * 1024.0)
    (line,) = plain_lines([o])
    eta = line.rsplit("ETA ", 1)[1]
    assert eta != "0:00:00", line
    text = rich_text([o])
    rows = [ln for ln in text.splitlines() if "a" * 12 in ln or ln.startswith("total")]
    assert len(rows) == 2 and all(f"ETA {eta}" in r for r in rows), (line, text)


def test_many_pods_columns_fit_a_160_column_terminal() -> None:
    ps = PullSet(clock=lambda: 100.0)
    from aggapi.plugins.collection import Change

    ps.apply(Change("LIST", items=(
        pod_image_pull("kube-system", "aggapi-agent-7x9q2-some-long-suffix",
                       node="aggapi-worker2", progress=40 * MiB, total=100 * MiB),
        pod_image_pull("default", "web-5d8f7c9b4-abcde", node="aggapi-worker",
                       phase="BackOff", progress=None, total=None,
                       reason='ImagePullBackOff: Back-off pulling image "registry.local:5000/'
                              'app:missing": not found in the registry, retrying later'))))
    con = Console(file=io.StringIO(), width=160, height=20, record=True)
    RichSetView(ps, console=con).close()
    text = "\n".join(ln for ln in con.export_text().splitlines() if "/" in ln)
    for cell in ("aggapi-worker2", "0/1", "40.0 MiB/100.0 MiB", "1.0 MiB/s", "0:01:00"):
        assert cell in text, text
    # Only the long reason gives way, and the screen is used to its edge.
    assert text.count("…") == 1 and "kube-system/aggapi-agent-7x9q2-some-long-suffix" in text
    assert max(len(ln) for ln in text.splitlines()) == 160, text
