"""CPU and memory of a process from /proc, for the benchmarks.

CPU is utime + stime from ``/proc/<pid>/stat`` (the process's own threads, not
its children); memory is VmRSS (now) and VmHWM (peak RSS since start) from
``/proc/<pid>/status``. ``pid`` may be an int or ``"self"``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20

Pid = int | str


def status_bytes(pid: Pid = "self") -> dict[str, int]:
    """VmRSS and VmHWM (and the other Vm* lines) of ``pid``, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Vm"):
            key, _, value = line.partition(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def rss_mib(pid: Pid = "self") -> float:
    return status_bytes(pid).get("VmRSS", 0) / MiB


def peak_rss_mib(pid: Pid = "self") -> float:
    return status_bytes(pid).get("VmHWM", 0) / MiB


def cpu_seconds(pid: Pid = "self") -> float:
    """utime + stime of ``pid`` so far (all its threads), in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # comm (field 2) may contain spaces: split after its closing parenthesis.
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


@dataclass
class CpuWindow:
    """CPU use of one process over a wall-clock window: ``start()`` then ``stop()``."""

    pid: Pid = "self"
    cpu0: float = 0.0
    wall0: float = 0.0
    cores: float = 0.0  # CPU seconds per wall second over the window
    seconds: float = 0.0

    def start(self) -> CpuWindow:
        self.cpu0, self.wall0 = cpu_seconds(self.pid), time.monotonic()
        return self

    def stop(self) -> float:
        self.seconds = time.monotonic() - self.wall0
        self.cores = (cpu_seconds(self.pid) - self.cpu0) / max(self.seconds, 1e-9)
        return self.cores


def usage(pid: Pid, window: CpuWindow | None = None) -> dict[str, float]:
    """{"cpu_cores", "rss_mib", "peak_rss_mib"} of ``pid`` (cpu from ``window`` if given)."""
    st = status_bytes(pid)
    out = {"rss_mib": st.get("VmRSS", 0) / MiB, "peak_rss_mib": st.get("VmHWM", 0) / MiB}
    if window is not None:
        out["cpu_cores"] = window.cores
    return out


@contextlib.contextmanager
def profiled(out: Path | None, key: str, pids: Mapping[str, int | None],
             native: bool = True, perf: bool = False, pyspy: bool = True) -> Iterator[None]:
    """py-spy (raw collapsed stacks) on ``pids`` while the block runs: one
    ``<key>-<name>.txt`` each, py-spy's own messages beside it in ``.log``. ``native``:
    C frames too (py-spy 0.4.3 cannot unwind the image's Debian Python: UNW_EBADREG).
    ``perf``: ``perf record`` on each too (``<key>-<name>.perf``), whose symbols name
    the C side py-spy cannot: memcpy, malloc, the TLS cipher, sha256, the kernel's copies
    (``perf report -i FILE --sort dso,sym``). ``pyspy=False``: perf alone (py-spy
    pauses each process it samples, which shows as scheduler time in perf)."""
    if out is None:
        yield
        return
    spies = []
    for name, pid in pids.items():
        if pid is None:
            continue
        base = out / f"{key.replace(' ', '_')}-{name.replace(' ', '_')}"
        with base.with_suffix(".log").open("w") as log:
            if pyspy:
                spies.append(subprocess.Popen(
                    ["py-spy", "record", "-p", str(pid), "-r", "97", *(["-n"] if native else []),
                     "-f", "raw", "-o", str(base.with_suffix(".txt"))],
                    stdout=log, stderr=subprocess.STDOUT))
            if perf:
                spies.append(subprocess.Popen(
                    ["perf", "record", "-q", "-F", "499", "-p", str(pid), "-o",
                     str(base.with_suffix(".perf"))],
                    stdout=log, stderr=subprocess.STDOUT))
    time.sleep(1)  # attached before the transfer starts
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait()


def timed(argv: list[str], cwd: Path) -> float:
    """Wall seconds of one command run to its end in ``cwd`` (a failure ends the bench
    with the tail of its stderr)."""
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed: {r.stderr.strip()[-2000:]}")
    return took
