"""``kubectl get podimagepulls -w`` followed row by row, for the scale harness: when
kubectl showed each pod's pull Done."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence

from tests.framework.controlplane import ControlPlane, binary
from tests.framework.procs import HarnessError, stop_child


class TableWatch:
    """``kubectl get podimagepulls -A -w``: the Table rows kubectl prints, the latest
    phase of each pod, and when kubectl first printed it Done (CLOCK_MONOTONIC)."""

    def __init__(self, cp: ControlPlane, args: Sequence[str] = ("-A",)) -> None:
        self.proc = subprocess.Popen(
            [binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "get",
             "podimagepulls", *args, "-w"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.columns: list[str] = []
        self.phase: dict[tuple[str, str], str] = {}
        self.node: dict[tuple[str, str], str] = {}
        self.done_at: dict[tuple[str, str], float] = {}
        self.seen_phases: dict[tuple[str, str], set[str]] = {}
        self.rows = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            cells = line.split()
            if not self.columns:
                self.columns = cells
                continue
            if len(cells) < len(self.columns) - 1:  # REASON may be wide: not needed
                continue
            row = dict(zip(self.columns, cells, strict=False))
            key = (row.get("NAMESPACE", ""), row.get("NAME", ""))
            with self._lock:
                self.rows += 1
                self.phase[key] = row.get("PHASE", "")
                self.seen_phases.setdefault(key, set()).add(self.phase[key])
                self.node[key] = row.get("NODE", "")
                if row.get("PHASE") == "Done":
                    self.done_at.setdefault(key, now)

    def done(self, keys: set[tuple[str, str]]) -> int:
        with self._lock:
            return len(keys & self.done_at.keys())

    def wait_done(self, keys: set[tuple[str, str]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.done(keys) == len(keys):
                return True
            if self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise HarnessError(f"kubectl get -w exited {self.proc.returncode}: {err}")
            time.sleep(0.25)
        return False

    def stop(self) -> None:
        stop_child(self.proc)
