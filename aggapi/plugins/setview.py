"""How the many-pods view (a workload, a selector, a node, -A) is shown: a live
screen of one row per pod on a terminal, changed lines only for pipes."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from aggapi.plugins.render import DONE_PHASES, PHASE_STYLE, human_bytes, human_eta


def header_lines(summary: Any) -> list[str]:
    """The set summed up: pods by state, then the slowest nodes (longest ETA)."""
    from aggapi.plugins.pullset import DONE, PULLING, STUCK, WAITING

    c = summary.counts
    lines = [f"{summary.pods} pods: {c[DONE]} done, {c[PULLING]} pulling, "
             f"{c[WAITING]} waiting for a slot, {c[STUCK]} stuck (BackOff/Failed/stalled)"]
    if summary.slowest:
        lines.append("slowest nodes: " + ", ".join(
            f"{n.node} ETA {human_eta(n.eta)}"
            f"{f' at {human_bytes(n.rate)}/s' if n.rate else ''} ({n.pulling} pods)"
            for n in summary.slowest))
    return lines


def fit_rows(height: int, max_rows: int | None) -> int:
    """Rows that fit a terminal of ``height`` lines under the two header lines, the
    table's own header and the "… and K more" line; ``--max-rows`` overrides."""
    return max_rows if max_rows is not None else max(height - 4, 1)


BAR = 20  # the progress bar's columns


def set_table(rows: list[Any], now: float, width: int | None = None) -> Any:
    """One table row per pod, in the order given (the pullset's: stuck first), fitted
    to ``width`` columns when given."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    cells: list[list[Any]] = []
    for r in rows:
        phase = r.shown_phase(now)
        total = r.total if r.total and r.total > 0 else None
        done = r.done
        bar = ProgressBar(total=float(total or 1), completed=float(
            (total or 1) if done else (r.progress or 0) if total else 0), width=BAR)
        size = (f"{human_bytes(r.progress or 0)}/{human_bytes(r.total)}"
                if r.total is not None else "-")
        shown = f"{phase}: {r.reason}" if r.reason else phase
        cells.append([escape(r.name), escape(r.node or "<none>"),
                      f"{r.present}/{len(r.images)}", bar, size,
                      f"{human_bytes(r.rate)}/s" if r.rate and not done else "-",
                      human_eta(r.eta) if r.eta is not None and not done else "-",
                      Text(shown, style=PHASE_STYLE.get(phase, "yellow"))])
    # The short columns keep their width; a long pod name and a long reason (the
    # last column) share what the terminal has left (rich would drop whole columns).
    heads = ("POD", "NODE", "IMAGES", "", "BYTES", "SPEED", "ETA", "PHASE")
    widths = [max([len(h)] + [Text.from_markup(c[n]).cell_len if isinstance(c[n], str)
                              else len(c[n]) if isinstance(c[n], Text) else BAR
                              for c in cells]) for n, h in enumerate(heads)]
    widths[3] = BAR
    if width is not None:
        room = width - 2 * (len(heads) - 1) - sum(widths[1:7])
        pod = min(widths[0], max(room // 2, room - max(min(widths[7], 24), 8)))
        widths[0], widths[7] = pod, max(room - pod, 8)
    for n, h in enumerate(heads):
        table.add_column(h, no_wrap=True, overflow="ellipsis",
                         min_width=None if n in (0, 7) and width is None else widths[n],
                         max_width=widths[n] if n in (0, 7) and width is not None else None)
    for c in cells:
        table.add_row(*c)
    return table


def set_screen(pullset: Any, limit: int, width: int | None = None) -> Any:
    """Header, the first ``limit`` rows, and how many more there are."""
    from rich.console import Group

    now = pullset.clock()
    rows = pullset.rows()
    parts: list[Any] = [Text(line, style="bold" if i == 0 else "")
                        for i, line in enumerate(header_lines(pullset.summary()))]
    parts.append(set_table(rows[:limit], now, width))
    if len(rows) > limit:
        parts.append(Text(f"… and {len(rows) - limit} more", style="dim"))
    return Group(*parts)


class RichSetView:
    """A live screen redrawn from the pullset: as many rows as the terminal holds."""

    def __init__(self, pullset: Any, max_rows: int | None = None,
                 console: Console | None = None) -> None:
        from rich.live import Live

        self.pullset, self.max_rows = pullset, max_rows
        self.console = console or Console()
        self.live = Live(Text(""), console=self.console, auto_refresh=False,
                         vertical_overflow="crop")
        self.live.start()

    def redraw(self) -> None:
        limit = fit_rows(self.console.size.height, self.max_rows)
        self.live.update(set_screen(self.pullset, limit, self.console.size.width),
                         refresh=True)

    def close(self) -> None:
        self.redraw()
        self.live.stop()


class PlainSetView:
    """For pipes: a line per (pod, container, image) whenever its phase or percentage
    changes; the header once at the end, on stderr (stdout stays one line per image)."""

    def __init__(self, pullset: Any, out: TextIO | None = None,
                 err: TextIO | None = None) -> None:
        self.pullset = pullset
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.last: dict[tuple[str, str, str], str] = {}

    def redraw(self) -> None:
        now = self.pullset.clock()
        lines = []
        for r in self.pullset.rows():
            stalled = r.stalled(now)
            for i in r.images:
                pct = ("100%" if i.phase in DONE_PHASES
                       else f"{100 * (i.progress or 0) // i.total}%" if i.total else "-")
                phase = "Stalled" if stalled and i.phase == "Downloading" else i.phase
                line = f"{r.name}  {i.container}  {i.image}  {phase}  {pct}"
                if i.reason:
                    line += f"  {i.reason}"
                k = (r.name, i.container, i.image)
                if self.last.get(k) != line:
                    self.last[k] = line
                    lines.append(line)
        if lines:
            print("\n".join(lines), file=self.out, flush=True)

    def close(self) -> None:
        self.redraw()
        print("\n".join(header_lines(self.pullset.summary())), file=self.err, flush=True)
