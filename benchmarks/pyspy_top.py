"""Summarise py-spy raw (collapsed) stack files: the top leaf frames by share, and by the
innermost Python frame above each leaf (which Python code pays for which native work).

Run: ``python3 -m benchmarks.pyspy_top FILE... [--top 12]``. Frames are aggregated by
function and file (line numbers dropped); native frames count like Python ones.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")
# A thread blocked in one of these is idle (py-spy's own idle test does not work with
# native frames): its samples are dropped, so shares are of on-CPU time.
WAITS = ("epoll_wait", "PyThread_acquire_lock_timed", "_queue_SimpleQueue_get",
         "pthread_cond_wait", "pthread_cond_timedwait", "sem_clockwait", "sem_timedwait",
         "select (", "poll (", "sleep (")


def frame_name(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (file.py)``."""
    fn, _, where = frame.partition(" (")
    where = _LINE.sub(")", "(" + where) if where else ""
    if where:
        where = "(" + where[1:].rsplit("/", 1)[-1]
    return f"{fn} {where}".strip()


def summarise(path: Path, top: int) -> str:
    own: Counter[str] = Counter()
    by_py: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if any(w in stack for w in WAITS):
            continue
        frames = [frame_name(f) for f in stack.split(";")]
        samples += n
        leaf = frames[-1]
        if leaf.startswith("0x"):  # an unnamed symbol: its library is what we know
            leaf = "?" + leaf.partition(" ")[2]
        own[leaf] += n
        # The innermost Python function and the native leaf below it: who pays for what.
        py = [f for f in frames if ".py)" in f]
        by_py[(py[-1] if py else "-") + " > " + leaf] += n
    out = [f"{path.name}: {samples} samples"]
    out.append("  self:  " + "; ".join(f"{f} {100 * n / samples:.0f}%"
                                       for f, n in own.most_common(top)))
    out.append("  by innermost Python frame > leaf:")
    out += [f"    {100 * n / samples:4.1f}% {f}" for f, n in by_py.most_common(top)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    for f in a.files:
        print(summarise(f, a.top))


if __name__ == "__main__":
    main()
