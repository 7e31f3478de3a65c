"""Processes the harness starts: in their own session, logged to a file, stopped by PID.

``start_logged`` is for a test's child (a ``Popen`` the test owns). ``spawn`` and
:class:`Proc` are for processes that outlive the Python process that started them
(``hack/local-up.sh``): a pidfile holds ``pid starttime``, so another process
(``hack/local-down.sh``) stops exactly that process and never a reused PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class HarnessError(RuntimeError):
    """The harness could not bring something up (or find what it needs)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_logged(argv: Sequence[str], log_path: Path, *, ready: Callable[[], bool],
                 log_tail: Callable[[], str], what: str, timeout: float,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Spawn ``argv`` in its own session (so it can be stopped by its process group),
    appending its output to ``log_path``; return once ``ready()`` holds.

    Raises RuntimeError if it exits first, TimeoutError (after killing it) if it is
    not ready in time.
    """
    with log_path.open("ab") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=None if env is None else dict(env))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log_tail()}")
        if ready():
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise TimeoutError(f"{what} not ready: {log_tail()}")


def stop_child(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM a child the caller started, SIGKILL it after ``grace`` seconds; reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (starttime): with the PID, names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return stat.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return None


@dataclass
class Proc:
    """A process we started: its pidfile holds ``pid starttime`` to survive PID reuse."""

    name: str
    pidfile: Path
    logfile: Path

    @classmethod
    def named(cls, state: Path, name: str) -> Proc:
        """``name``'s pidfile and log in a state directory (``pids/``, ``logs/``)."""
        return cls(name, state / "pids" / f"{name}.pid", state / "logs" / f"{name}.log")

    def pid(self) -> int | None:
        try:
            pid_s, start = self.pidfile.read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_s)
        return pid if start_time(pid) == start else None

    def alive(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def record(self, pid: int) -> None:
        """Adopt a process started some other way (its pidfile, as ``spawn`` writes it)."""
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text(f"{pid} {start_time(pid)}\n")

    def stop(self, timeout: float = 10.0) -> None:
        pid = self.pid()
        if pid is not None:
            # Our processes lead their own session: signal that process group, by our PID.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        self.pidfile.unlink(missing_ok=True)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def spawn(name: str, argv: Sequence[str], state: Path, *,
          env: Mapping[str, str] | None = None) -> Proc:
    """Start ``argv`` in its own session, output to ``<state>/logs/<name>.log``, and
    record it in ``<state>/pids/<name>.pid``."""
    (state / "pids").mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(parents=True, exist_ok=True)
    proc = Proc.named(state, name)
    if proc.alive():
        raise HarnessError(f"{name} already running (pid {proc.pid()})")
    with open(proc.logfile, "ab") as out:
        out.write(f"\n--- {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        out.flush()
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True, env=dict(env) if env else None)
    start = None
    for _ in range(100):
        start = start_time(p.pid)
        if start:
            break
        time.sleep(0.01)
    proc.pidfile.write_text(f"{p.pid} {start}\n")
    return proc


def wait_ready(ok: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None,
               poll: float = 0.25) -> None:
    """Until ``ok()``; fails early, with its log, if ``proc`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if proc is not None and not proc.alive():
            raise HarnessError(f"{what}: process exited\n{proc.tail()}")
        time.sleep(poll)
    raise HarnessError(f"{what}: not ready after {timeout}s\n" + (proc.tail() if proc else ""))


def follow_json_lines(proc: subprocess.Popen[str], objects: list[tuple[float, dict[str, Any]]],
                      clock: Callable[[], float] = time.monotonic,
                      on_end: Callable[[], None] | None = None) -> threading.Thread:
    """Append (``clock()``, object) to ``objects`` for each JSON object line ``proc``
    prints (other lines are skipped), from a daemon thread; ``on_end`` once it exits."""

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                objects.append((clock(), obj))
        if on_end is not None:
            proc.wait()
            on_end()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t
