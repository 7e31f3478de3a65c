"""The throttle proxy in front of the node's registry: the node's own (a process, its rate
set through a control file) and callers' own (:func:`throttle_for`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.framework.nodelayout import NodeLayout, _http_ok, _wait
from tests.framework.procs import free_port, spawn
from tests.framework.repo import python_env
from tests.framework.throttle import ThrottleProxy


@contextlib.contextmanager
def throttle_for(upstream: str, containerd_dirs: Sequence[Path], rate: float | None = None,
                 *, bind: str = "127.0.0.1") -> Iterator[ThrottleProxy]:
    """A ThrottleProxy of the caller's own in front of the registry ``upstream``,
    registered in the certs.d of every containerd whose directory is in
    ``containerd_dirs`` (a cluster's nodes share one link through it) the way
    tests.framework.containerd registers hosts (hosts.toml is read at each pull), removed
    again at the end."""
    proxy = ThrottleProxy(upstream, rate, bind=bind)
    proxy.start()
    dirs = [d / "certs.d" / proxy.host for d in containerd_dirs]
    try:
        for hosts in dirs:
            hosts.mkdir(parents=True, exist_ok=True)
            (hosts / "hosts.toml").write_text(
                f'server = "http://{proxy.host}"\n\n'
                f'[host."http://{proxy.host}"]\n  capabilities = ["pull", "resolve"]\n')
        yield proxy
    finally:
        proxy.stop()
        for hosts in dirs:
            shutil.rmtree(hosts, ignore_errors=True)



def _serve_throttle(upstream: str, port: int, control: Path, bind: str) -> None:
    """ThrottleProxy (its own loop thread) in this process; applies the rate changes
    written to ``control`` and acknowledges each in ``<control>.ack``."""
    proxy = ThrottleProxy(upstream, port=port, bind=bind)
    proxy.start()
    ack = control.with_suffix(".ack")
    seen = -1
    while True:
        with contextlib.suppress(OSError, ValueError):
            ctl = json.loads(control.read_text())
            seq = int(ctl.get("seq", 0))
            if seq != seen:
                rate = ctl.get("rate")
                proxy.set_rate(float(rate) if rate else None)
                tmp = ack.with_suffix(".ack.tmp")
                tmp.write_text(f"{seq}\n")
                tmp.replace(ack)
                print(f"throttle: rate {rate} (seq {seq})", flush=True)
                seen = seq
        time.sleep(0.05)



class NodeThrottle(NodeLayout):
    @property
    def _throttle_ctl(self) -> Path:
        return self.dir / "throttle.json"

    def _start_throttle(self) -> None:
        proc = self.proc("throttle")
        if proc.alive() and self.info.throttle_host:
            return
        port = free_port(self.bind)
        self._throttle_ctl.write_text(json.dumps({"rate": None, "seq": 0}))
        proc = spawn("node-throttle", [
            sys.executable, "-m", "tests.framework.node", "throttle",
            f"--upstream={self.info.registry_host}", f"--port={port}", f"--bind={self.bind}",
            f"--control={self._throttle_ctl}"], self.cp.state, env=python_env())
        self.info.throttle_host = f"{self.bind}:{port}"
        self._save()
        _wait(lambda: _http_ok(f"http://{self.info.throttle_host}/v2/"), 20,
              "throttle proxy", proc)

    @contextlib.contextmanager
    def own_throttle(self, rate: float | None = None, *,
                     bind: str = "127.0.0.1") -> Iterator[ThrottleProxy]:
        """A throttle of the caller's own in front of the node's registry (the node's
        proxy paces every blob together; this one's record and rate are the caller's),
        trusted by the node's containerd (:func:`throttle_for`)."""
        with throttle_for(self.info.registry_host, [Path(self.info.containerd_dir)], rate,
                          bind=bind) as proxy:
            yield proxy

    def set_rate(self, rate: float | None, timeout: float = 10.0) -> None:
        """Limit pulls through :meth:`via_throttle` to ``rate`` bytes/s (None: unlimited).

        Returns once the proxy process has applied it."""
        try:
            seq = int(json.loads(self._throttle_ctl.read_text()).get("seq", 0)) + 1
        except (OSError, ValueError):
            seq = 1
        tmp = self._throttle_ctl.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rate": rate, "seq": seq}))
        tmp.replace(self._throttle_ctl)
        ack = self._throttle_ctl.with_suffix(".ack")
        _wait(lambda: ack.exists() and ack.read_text().strip() == str(seq), timeout,
              "throttle rate change", self.proc("throttle"))
