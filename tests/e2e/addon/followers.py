"""Followers of a rollout as users run them, read as they print: ``kubectl get -w -o
json`` (JsonWatch) and any process whose output is kept whole (Drained)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.framework.procs import stop_child

PRESENT = ("Done", "AlreadyPresent")


@dataclass
class JsonWatch:
    """``kubectl get ... -w -o json``: the objects it prints (indented, one after
    another), each with its receive time."""

    argv: list[str]
    objects: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None
    _err: str = ""

    def start(self) -> JsonWatch:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        buf: list[str] = []
        for line in self.proc.stdout:
            buf.append(line)
            if line.startswith("}"):  # the end of a top-level object (indented output)
                self.objects.append((time.monotonic(), json.loads("".join(buf))))
                buf = []

    def state(self) -> str:
        """For failure messages: how far it got."""
        assert self.proc is not None
        last = self.latest()
        phases = Counter(str((o.get("status") or {}).get("phase")) for o in last.values())
        ended = "running" if self.proc.poll() is None else \
            f"exited {self.proc.poll()}: {self.stderr()[-500:]!r}"
        return (f"kubectl -w {ended}: {len(self.objects)} objects, {len(last)} pods, "
                f"last phases {dict(phases)}; not present: "
                + "; ".join(f"{n} {json.dumps(o.get('status'))}" for n, o in last.items()
                            if (o.get("status") or {}).get("phase") not in PRESENT)[:3000])

    def stderr(self) -> str:
        """What it printed on stderr (once it has exited; "" while it runs)."""
        assert self.proc is not None and self.proc.stderr is not None
        if self.proc.poll() is not None and not self._err:
            self._err = self.proc.stderr.read() or "(nothing)"
        return self._err

    def latest(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for _, o in list(self.objects):
            out[str((o.get("metadata") or {}).get("name"))] = o
        return out

    def stop(self) -> tuple[int | None, str]:
        """(exit code if it had exited by itself, stderr)."""
        assert self.proc is not None and self.proc.stderr is not None
        rc = self.proc.poll()
        stop_child(self.proc)
        if self._thread is not None:
            self._thread.join(10)
        return rc, self._err or self.proc.stderr.read()


@dataclass
class Drained:
    """A process whose stdout and stderr are read as they come (a full pipe would
    stall it), kept whole."""

    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    _out: list[str] = field(default_factory=list)
    _err: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Drained:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for stream, into in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
            t = threading.Thread(target=lambda s=stream, i=into: i.extend(s), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait(self, timeout: float) -> bool:
        """Whether it exited within ``timeout`` seconds."""
        assert self.proc is not None
        try:
            self.proc.wait(max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> tuple[str, str]:
        """Killed if still running; (stdout, stderr)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(10)
        return "".join(self._out), "".join(self._err)
