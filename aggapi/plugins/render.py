"""How the plugins show progress: rich bars on a terminal, plain lines otherwise.

Image pulls of one pod: one aggregate bar first, then one bar per (container, image, layer), each
with bytes, the server's speed and ETA (per layer at layer granularity) and the
phase; Waiting (pull slot limit), BackOff, Extracting and errors stand out. Every
object from the server is cleaned of control characters first (``sanitize``), and
no server text is read as rich markup. The copy bar is ``transferbar``, the
many-pods screen ``setview``.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text

from aggapi.plugins.sanitize import clean, clean_obj

Obj = dict[str, Any]
DONE_PHASES = ("Done", "AlreadyPresent")
PHASE_STYLE = {"Pending": "dim", "Pulling": "blue", "Waiting": "yellow",
               "Resolving": "blue", "Downloading": "white",
               "Extracting": "cyan", "Done": "green", "AlreadyPresent": "green",
               "Failed": "bold red", "BackOff": "red", "Unknown": "dim",
               "Unscheduled": "yellow"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def human_eta(s: float | None) -> str:
    """Seconds left, rounded up (0:00:00 only when nothing is left), for every view."""
    if s is None:
        return "-"
    s = math.ceil(max(s, 0.0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def slot_text(w: Obj) -> str:
    """The node's pull slots from a Waiting object's ``waiting``: ``limit`` is an int
    (or null) with ``slots`` beside it; servers before that sent the kubelet
    config's dict as ``limit``."""
    raw_pulls = w.get("inFlight")
    pulls: list[Any] = raw_pulls if isinstance(raw_pulls, list) else []
    busy = _int(w.get("inFlightCount"))
    busy = len(pulls) if busy is None else busy
    raw_slots = w.get("slots")
    slots: dict[str, Any] = raw_slots if isinstance(raw_slots, dict) else {}
    raw_limit = w.get("limit")
    if isinstance(raw_limit, dict):  # an older server: the kubelet config's fields
        slots = {"limit": raw_limit.get("parallelSlots"), "error": raw_limit.get("error")}
        raw_limit = None
    limit = _int(raw_limit)
    if limit is None:
        limit = _int(slots.get("limit"))
    text = f"{busy}/{limit} in use" if limit is not None else f"{busy} in flight"
    others = busy - len(pulls)
    if others > 0 and pulls:
        text += f", {others} of other pods"
    if limit is None and slots.get("error"):
        text += f"; limit unknown: {slots['error']}"
    return text


def shown_phase(o: Obj) -> str:
    """The phase shown: a layer whose bytes are all on the node is AlreadyPresent, also
    while the server holds it at Pulling or Pending (kubelet pulls the image again and
    the runtime has not said more yet)."""
    phase = str(o.get("phase") or "")
    total, got = _int(o.get("total")), _int(o.get("progress"))
    if (phase in ("Pulling", "Pending") and o.get("layer") and total and got is not None
            and got >= total):
        return "AlreadyPresent"
    return phase


def phase_text(o: Obj) -> str:
    phase = shown_phase(o)
    w = o.get("waiting")
    if phase == "Waiting" and isinstance(w, dict):
        return f"Waiting for a pull slot ({slot_text(w)})"
    if phase == "BackOff":
        attempt, back_off = _int(o.get("attempt")), _int(o.get("backOffSeconds"))
        bits = [f"attempt {attempt}" if attempt else "",
                f"retry in ~{back_off}s" if back_off is not None else ""]
        detail = ", ".join(b for b in bits if b)
        phase = f"BackOff ({detail})" if detail else phase
    if o.get("error"):
        return f"{phase}: {o['error']}"
    return phase


def row_label(o: Obj, granularity: str) -> str:
    if granularity == "pod":
        return "pod"
    name = f"{o.get('container', '')} {o.get('image', '')}".strip()
    layer = str(o.get("layer") or "")
    if layer:
        name += f" {layer.removeprefix('sha256:')[:12]}"
    return name


def key(o: Obj) -> tuple[str, str, str]:
    return (str(o.get("container", "")), str(o.get("image", "")), str(o.get("layer", "")))


class Aggregate:
    """The sum over rows: bytes known only when every row's total is known."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], Obj] = {}

    def update(self, o: Obj) -> None:
        self.rows[key(o)] = o

    def _summed(self) -> list[Obj]:
        """The rows the sum is over: an image's row (sent before its layers were known,
        or standing for layers the server holds back) counts only while no layer of
        that image has come; after that its layers do."""
        layered = {k[:2] for k in self.rows if k[2]}
        return [o for k, o in self.rows.items() if k[2] or k[:2] not in layered]

    def totals(self) -> tuple[int, int | None, float | None, float | None]:
        rows = self._summed()
        done = sum(max(0, int(o.get("progress") or 0)) for o in rows)
        totals = [t if isinstance(t := o.get("total"), int) else -1 for o in rows]
        total = sum(totals) if totals and all(t >= 0 for t in totals) else None
        rates = [float(o["bytesPerSecond"]) for o in rows if o.get("bytesPerSecond") is not None]
        rate = sum(rates) if rates else None
        # The sum ends with its last row (the server times an image by its last
        # layer too): the longest ETA, unknown while a row with bytes left has none.
        left = [o for o in rows if shown_phase(o) not in DONE_PHASES]
        etas = [e for o in left if isinstance(e := o.get("etaSeconds"), int | float)]
        eta = max(map(float, etas), default=0.0) if len(etas) == len(left) else None
        return done, total, rate, eta


# --- image pulls ---------------------------------------------------------------------

class _Speed(ProgressColumn):
    def render(self, task: Any) -> Text:
        r = task.fields.get("rate")
        return Text(f"{human_bytes(r)}/s" if r else "-", style="progress.data.speed")


class _Bytes(ProgressColumn):
    """Done/total in the binary units of the speed (rich's DownloadColumn is decimal)."""

    def render(self, task: Any) -> Text:
        done = human_bytes(task.completed)
        if task.total is None:
            return Text(done, style="progress.download")
        total = human_bytes(task.total)
        # "5.0/10.0 MiB" when both share a unit
        if done.split()[-1] == total.split()[-1]:
            done = done.split()[0]
        return Text(f"{done}/{total}", style="progress.download")


class _Eta(ProgressColumn):
    def render(self, task: Any) -> Text:
        return Text("ETA " + human_eta(task.fields.get("eta")), style="progress.remaining")


class _Phase(ProgressColumn):
    def render(self, task: Any) -> Text:
        return Text(task.fields.get("phase", ""), style=task.fields.get("style", ""))


class PullView:
    """Interface of both pull renderers."""

    def update(self, o: Obj) -> None:
        raise NotImplementedError

    def retrying(self, exc: BaseException, delay: float) -> None:
        pass

    def close(self) -> None:
        pass


class RichPullView(PullView):
    def __init__(self, granularity: str, console: Console | None = None) -> None:
        self.granularity = granularity
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=30), TaskProgressColumn(),
            _Bytes(), _Speed(), _Eta(), _Phase(), console=self.console,
            refresh_per_second=8)
        self.rows: dict[tuple[str, str, str], TaskID] = {}
        self.agg = Aggregate()
        self.total: TaskID | None = None
        self.progress.start()

    def _set(self, task: TaskID, progress: int, total: int | None, rate: float | None,
             eta: float | None, phase: str, style: str, finished: bool) -> None:
        if finished:
            total = total if total and total > 0 else max(progress, 1)
            progress = total
        self.progress.update(task, completed=max(progress, 0), total=total, rate=rate,
                             eta=eta, phase=phase, style=style)

    def update(self, o: Obj) -> None:
        o = clean_obj(o)
        kind = o.get("kind")
        if kind == "Progress":
            self._row(o)
        elif kind == "Summary":
            # The aggregate bar, or at pod granularity the one row there is.
            task = self.total if self.total is not None else next(iter(self.rows.values()),
                                                                  None)
            if task is None:
                task = self.total = self.progress.add_task("[bold]total", total=None)
            tot = int(o.get("total") or 0)
            self._set(task, int(o.get("progress") or 0), tot if tot > 0 else None, None,
                      None, str(o.get("phase")), "green", True)
        elif kind == "Error":
            self.console.print(Text(f"error: {o.get('error')}", style="bold red"))

    def _row(self, o: Obj) -> None:
        k = key(o)
        if self.total is None and self.granularity != "pod":
            self.total = self.progress.add_task("[bold]total", total=None)  # first row
        if k not in self.rows:
            self.rows[k] = self.progress.add_task(escape(row_label(o, self.granularity)),
                                                  total=None)
        total = o.get("total")
        phase = shown_phase(o)
        self._set(self.rows[k], int(o.get("progress") or 0),
                  int(total) if isinstance(total, int) and total >= 0 else None,
                  o.get("bytesPerSecond"), o.get("etaSeconds"), phase_text(o),
                  PHASE_STYLE.get(phase, ""), phase in DONE_PHASES)
        if self.granularity == "pod":
            return
        self.agg.update(o)
        assert self.total is not None
        done, tot, rate, eta = self.agg.totals()
        phases = [shown_phase(r) for r in self.agg.rows.values()]
        failed = "Failed" in phases
        self._set(self.total, done, tot, rate, eta, "Failed" if failed else "",
                  "bold red" if failed else "", all(p in DONE_PHASES for p in phases))

    def retrying(self, exc: BaseException, delay: float) -> None:
        self.console.print(Text(f"stream interrupted ({clean(str(exc)) or type(exc).__name__}); "
                                f"reconnecting in {delay:.1f}s", style="yellow"))

    def close(self) -> None:
        self.progress.stop()


class PlainPullView(PullView):
    """One line per object, for logs and pipes."""

    def __init__(self, granularity: str, out: TextIO | None = None,
                 err: TextIO | None = None) -> None:
        self.granularity = granularity
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.last: dict[tuple[str, str, str], str] = {}  # the line printed per row

    def update(self, o: Obj) -> None:
        o = clean_obj(o)
        kind = o.get("kind")
        if kind == "Progress":
            # Unknown sizes: null from the server, -1 from servers before it.
            total = _int(o.get("total"))
            total = total if total is not None and total >= 0 else None
            got = _int(o.get("progress"))
            prog = got if got is not None and got >= 0 else 0
            size = (f"{human_bytes(prog)}/{human_bytes(total)}" if total is not None
                    else human_bytes(prog) if got is not None and got >= 0 else "-")
            pct = (f"{100 * prog // total}%" if total
                   else "100%" if shown_phase(o) in DONE_PHASES else "-")
            rate = o.get("bytesPerSecond")
            line = (f"{row_label(o, self.granularity)}  {phase_text(o)}  {size}  {pct}  "
                    f"{human_bytes(rate) + '/s' if rate else '-'}  "
                    f"ETA {human_eta(o.get('etaSeconds'))}")
            if self.last.get(key(o)) == line:
                return  # the server resends a row whose shown fields did not change
            self.last[key(o)] = line
        elif kind == "Summary":
            imgs = ", ".join(f"{i.get('container')}={i.get('phase')}"
                             for i in o.get("images") or [])
            line = f"summary  {o.get('phase')}  {imgs}"
        elif kind == "Error":
            print(f"error: {o.get('error')}", file=self.err, flush=True)
            return
        else:
            line = str(o)
        print(line, file=self.out, flush=True)

    def retrying(self, exc: BaseException, delay: float) -> None:
        print(f"stream interrupted ({clean(str(exc)) or type(exc).__name__}); reconnecting in "
              f"{delay:.1f}s", file=self.err, flush=True)
