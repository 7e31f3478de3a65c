"""What runs beside bench_scale's rollout: aggapi's CPU, RSS and watches sampled every
second, and the plugin following the rollout as users run it."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path

from benchmarks._procstats import cpu_seconds, status_bytes
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.procs import stop_child
from tests.framework.scale import ScaleCluster
from tests.plugins.helpers import install_plugins, plugin_env

PREFIX = "aggapi_apiserver_collection"  # aggapi's gauges of the collections' cost


class Sampler(threading.Thread):
    """aggapi's CPU and RSS every second; kube-apiserver's watches every few."""

    def __init__(self, sc: ScaleCluster, pid: int) -> None:
        super().__init__(daemon=True)
        self.sc, self.pid = sc, pid
        self.stop_event = threading.Event()
        self.cores: list[float] = []
        self.rss_peak = 0
        self.watches: list[float] = []
        self.node_polls: list[float] = []
        self.collection_watches: list[float] = []

    def run(self) -> None:
        before = sum(self.sc.watches_before_aggapi.values())
        last_cpu, last_t, n = cpu_seconds(self.pid), time.monotonic(), 0
        while not self.stop_event.wait(1.0):
            try:
                cpu, now = cpu_seconds(self.pid), time.monotonic()
            except OSError:  # aggapi gone (the run failed and took the harness down)
                return
            self.cores.append((cpu - last_cpu) / (now - last_t))
            last_cpu, last_t = cpu, now
            self.rss_peak = max(self.rss_peak, status_bytes(self.pid).get("VmRSS", 0))
            n += 1
            if n % 3 == 1:
                try:
                    self.watches.append(sum(self.sc.kube_watches().values()) - before)
                    m = self.sc.aggapi_metrics()
                    self.node_polls.append(m.get(f"{PREFIX}_node_polls", 0.0))
                    self.collection_watches.append(m.get(f"{PREFIX}_watches", 0.0))
                except OSError:
                    pass

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


class PluginFollow:
    """``kubectl image-pull-progress -A``, its output drained from a pipe: the plugin's
    CPU (kubectl execs it: one PID) while it follows the rollout. It ends by itself
    once every pod it follows is done: its CPU is read at each line it prints, the
    last of them just before it exits."""

    def __init__(self, cp: ControlPlane, bin_dir: Path) -> None:
        install_plugins(bin_dir)
        self.proc = subprocess.Popen(
            [binary("kubectl"), "image-pull-progress", "-A"],
            env=plugin_env(bin_dir, cp.admin_kubeconfig), stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        self.lines = 0
        self.cpu0 = self.cpu = cpu_seconds(self.proc.pid)
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            self.lines += 1
            with contextlib.suppress(OSError):
                self.cpu = cpu_seconds(self.proc.pid)

    def stop(self) -> tuple[float, int | None]:
        """CPU seconds used, and the exit code if it ended by itself."""
        rc = self.proc.poll()
        if rc is None:
            with contextlib.suppress(OSError):
                self.cpu = cpu_seconds(self.proc.pid)
            stop_child(self.proc)
        self._drain.join(5)
        return self.cpu - self.cpu0, rc
