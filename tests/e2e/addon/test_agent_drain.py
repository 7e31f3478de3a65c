"""An agent roll mid-copy (issue 35): ``kubectl delete pod`` of the node's agent while
three ``kubectl ncp`` copies run through it at once: a 1 GiB upload and a 1 GiB download
at full speed, and a slow upload (``--limit-rate``) that cannot finish within the drain.

One deletion for the three keeps the test to one agent roll. Asserted, per copy:
- ncp succeeds on its own (default retries, no second command), the target complete;
- a copy that failed on the way failed at its client within 1 s of the agent no longer
  serving it (the agent's log line ending it, or the agent's exit);
- the slow upload is ended at the start of the drain (its client's error within a few
  seconds of the deletion plus the preStop sleep), not when the grace period runs out
  and the agent is killed, after the client poured its body into a dying process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.addon.helpers import MiB, delete_pods, exec_in, run_pod, until
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.controlplane import binary
from tests.framework.repo import REPO

pytestmark = pytest.mark.e2e

GiB = 1024 * MiB
# 28 s a try: at SIGTERM (the preStop sleep after the deletion, itself a second or two
# into the copy) about 20 s are left, more than the drain's 15 s and than what is left of
# the grace period (25 s from the deletion).
SLOW_SIZE, SLOW_RATE = 84 * MiB, 3 * MiB
PRESTOP = 5.0  # the chart's agent.preStopSleepSeconds: SIGTERM comes this long after
# A failure as ncp -v=6 logs it: a request answered 5xx/429, one with no answer (blank
# status), or the retry line of aggapi.client.retry.
FAILED = re.compile(r"\] (POST|GET|HEAD) \S+ (5\d\d|429) |\] (POST|GET|HEAD) \S+  in "
                    r"|\] retrying in ")


@dataclass
class Timed:
    """A process whose output lines are kept with their arrival time (monotonic)."""

    argv: list[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0
    ended: float | None = None
    rc: int | None = None

    def start(self) -> Timed:
        self.started = time.monotonic()
        proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=REPO)

        def follow() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.rc = proc.wait()
            self.ended = time.monotonic()

        threading.Thread(target=follow, daemon=True).start()
        return self

    def wait(self, timeout: float) -> int:
        until(lambda: self.ended is not None, timeout, f"{self.argv[:6]} to end")
        assert self.rc is not None
        return self.rc

    def first(self, pattern: re.Pattern[str] | str) -> float | None:
        for t, line in self.lines:
            if re.search(pattern, line):
                return t
        return None

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _ncp(a: Addon, *args: str, rate: str | None = None) -> Timed:
    argv = [sys.executable, "-m", "aggapi.plugins.ncp", "-q", "-v=6",
            f"--kubeconfig={a.cp.admin_kubeconfig}", "-c", "c"]
    if rate:
        argv.append(f"--limit-rate={rate}")
    return Timed([*argv, *args]).start()


def _sha(path: Path) -> str:
    return subprocess.run(["sha256sum", str(path)], check=True, capture_output=True,
                          text=True).stdout.split()[0]


def test_agent_deleted_during_copies(installed_addon: Addon, two_node_cluster: Cluster,
                                     tmp_path: Path) -> None:
    a = installed_addon
    cp = a.cp
    node = two_node_cluster.node(2).name
    # The download from a pod of its own: the uploads take both of a pod's copy slots
    # (agent.copiesPerPod).
    pod, src_pod = "addon-drain", "addon-drain-src"
    t_start = time.monotonic()
    for p in (pod, src_pod):
        run_pod(cp, p, node, wait=False)
    cp.kubectl("wait", "--for=condition=Ready", f"pod/{pod}", f"pod/{src_pod}",
               "--timeout=120s")
    try:
        exec_in(cp, pod, "sh", "-c", "mkdir -p /tmp/d && echo original > /tmp/d/up && "
                "echo original > /tmp/d/slow")
        exec_in(cp, src_pod, "sh", "-c",
                "mkdir -p /tmp/d && head -c 1073741824 /dev/urandom > /tmp/d/src")
        remote_src = exec_in(cp, src_pod, "sha256sum", "/tmp/d/src").split()[0]
        big, slow = tmp_path / "big", tmp_path / "slow"
        for f, n in ((big, GiB), (slow, SLOW_SIZE)):
            with f.open("wb") as out:
                subprocess.run(["head", "-c", str(n), "/dev/urandom"], stdout=out, check=True)
        agent = a.agent_pod(node)["metadata"]["name"]
        logs = Timed([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "-n",
                      a.namespace, "logs", "-f", "--tail=0", agent]).start()
        t_copies = time.monotonic()
        copies = {
            "up": _ncp(a, str(big), f"{pod}:/tmp/d/up"),
            "down": _ncp(a, f"{src_pod}:/tmp/d/src", str(tmp_path / "back")),
            "slow": _ncp(a, str(slow), f"{pod}:/tmp/d/slow", rate=f"{SLOW_RATE}"),
        }
        # Mid-copy: both uploads have a temp file in the container.
        until(lambda: len([n for n in exec_in(cp, pod, "ls", "-A", "/tmp/d").split()
                           if n.startswith(".aggapi-tmp-")]) >= 2, 30, "two uploads running")
        t_del = time.monotonic()
        a.kubectl("-n", a.namespace, "delete", "pod", agent, "--wait=false")
        rcs = {k: c.wait(240) for k, c in copies.items()}
        t_done = time.monotonic()
        logs.wait(60)
        t_exit = logs.first("agent stopped") or logs.ended
        assert t_exit is not None
        t_sigterm = logs.first("draining")

        report = []
        for k, c in copies.items():
            assert rcs[k] == 0, f"ncp {k} failed: {c.text()[-2000:]}"
            failed = c.first(FAILED)
            remote = {"up": "/tmp/d/up", "down": "/tmp/d/src", "slow": "/tmp/d/slow"}[k]
            ended = logs.first(f"copy ended by the drain.*{re.escape(remote)}")
            stop = min(x for x in (ended, t_exit) if x is not None)
            assert failed is None or failed > t_del, \
                f"{k} failed before the deletion\n{c.text()[-2000:]}"
            if failed is not None:
                assert failed - stop <= 1.0, \
                    f"{k}: the client's error came {failed - stop:.2f}s after the agent " \
                    f"stopped serving it\n{c.text()[-2000:]}\n{logs.text()[-3000:]}"
            report.append(f"{k}: " + (f"error at +{failed - t_del:.2f}s "
                                      f"({failed - stop:+.2f}s after the agent stopped "
                                      "serving it), " if failed is not None else "no error, ")
                          + f"done at +{(c.ended or 0) - t_del:.1f}s")
        slow_failed = copies["slow"].first(FAILED)
        assert slow_failed is not None, "the slow upload finished although it could not"
        assert slow_failed - t_del <= PRESTOP + 3.0, \
            f"the slow upload failed {slow_failed - t_del:.1f}s after the deletion: not at " \
            f"the drain's start\n{copies['slow'].text()[-2000:]}"
        # Targets complete (ncp checked every digest; read back the uploads once).
        assert _sha(tmp_path / "back") == remote_src
        assert exec_in(cp, pod, "sha256sum", "/tmp/d/up").split()[0] == _sha(big)
        assert exec_in(cp, pod, "sha256sum", "/tmp/d/slow").split()[0] == _sha(slow)
        left = [n for n in exec_in(cp, pod, "ls", "-A", "/tmp/d").split()
                if n.startswith(".aggapi-tmp-")]
        assert not left, left
        drain = json.dumps({"sigterm": None if t_sigterm is None else
                            round(t_sigterm - t_del, 2), "exit": round(t_exit - t_del, 2)})
        print(f"\nagent drain: deleted at +{t_del - t_copies:.1f}s into the copies; agent "
              f"(s after deletion) {drain}; " + "; ".join(report) +
              f"; all ncp done {t_done - t_del:.1f}s after the deletion; "
              f"test {time.monotonic() - t_start:.1f}s")
        a.wait_ready(timeout=120)
    finally:
        delete_pods(cp, pod, src_pod)
