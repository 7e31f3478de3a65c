"""Pods, raw kubectl streams and paced uploads for the installed add-on's e2e tests."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.framework.addon import IMAGE_REPOSITORY, IMAGE_TAG, wait_for
from tests.framework.controlplane import GROUP, VERSION, ControlPlane, binary
from tests.framework.kubelet import pod_manifest
from tests.framework.procs import follow_json_lines

GV = f"/apis/{GROUP}/{VERSION}"
MiB = 1 << 20
# The aggapi image is on every node already (imported, imagePullPolicy Never); as a
# workload it just sleeps. It runs as uid 65532, which owns nothing but /tmp.
SLEEPER = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"


def path(sub: str, pod: str, *, ns: str = "default", watch: bool = False, **q: str) -> str:
    qs = "&".join(f"{k}={v}" for k, v in q.items())
    return f"{GV}{'/watch' if watch else ''}/namespaces/{ns}/pods/{pod}/{sub}" + \
        (f"?{qs}" if qs else "")


def kubectl_argv(cp: ControlPlane, user: str | None, *args: str) -> list[str]:
    kc = cp.admin_kubeconfig if user is None else cp.user_kubeconfig(user)
    return [binary("kubectl"), f"--kubeconfig={kc}", *args]


def run_pod(cp: ControlPlane, name: str, node: str, image: str = SLEEPER, *,
            command: tuple[str, ...] = ("sleep", "3600"), pull_policy: str = "Never",
            wait: bool = True) -> None:
    c: dict[str, Any] = {"name": "c", "image": image}
    if command:
        c["command"] = list(command)
    cp.kubectl("delete", "pod", name, "--ignore-not-found", "--grace-period=0", "--force")
    cp.kubectl("create", "-f", "-", input=json.dumps(
        pod_manifest(name, [c], node=node, pull_policy=pull_policy)))
    if wait:
        cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")


def delete_pods(cp: ControlPlane, *names: str) -> None:
    cp.kubectl("delete", "pod", *names, "--ignore-not-found", "--grace-period=0", "--force",
               check=False)


def exec_in(cp: ControlPlane, pod: str, *cmd: str) -> str:
    return cp.kubectl("exec", pod, "-c", "c", "--", *cmd).stdout


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class RawStream:
    """``kubectl get --raw PATH`` in the background: each JSON line with its receive time."""

    cp: ControlPlane
    path: str
    user: str | None = None
    objects: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    ended: float | None = None
    proc: subprocess.Popen[str] | None = None
    stderr: str = ""

    def start(self) -> RawStream:
        self.proc = subprocess.Popen(kubectl_argv(self.cp, self.user, "get", "--raw", self.path),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def ended() -> None:
            self.ended = time.monotonic()

        follow_json_lines(self.proc, self.objects, on_end=ended)
        return self

    def wait_objects(self, n: int, timeout: float) -> None:
        wait_for(lambda: len(self.objects) >= n or self.ended is not None, timeout,
                 f"{n} objects on {self.path}")
        assert len(self.objects) >= n, f"ended after {self.objects}: {self.read_stderr()}"

    def wait_end(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.ended is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.ended is not None

    def read_stderr(self) -> str:
        if self.proc is not None and self.proc.poll() is not None and self.proc.stderr:
            self.stderr = self.proc.stderr.read()
        return self.stderr

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class PacedUpload:
    """``kubectl create --raw PATH -f -`` fed ``size`` bytes at ``rate`` bytes/s from a
    thread (distinct chunks, so a partial file cannot pass for the whole)."""

    cp: ControlPlane
    path: str
    size: int
    rate: float
    sent: int = 0
    digest: str = ""
    rc: int | None = None
    out: str = ""
    err: str = ""
    _thread: threading.Thread | None = None

    def start(self) -> PacedUpload:
        proc = subprocess.Popen(kubectl_argv(self.cp, None, "create", "--raw", self.path,
                                             "-f", "-"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

        def feed() -> None:
            assert proc.stdin is not None
            h = hashlib.sha256()
            block = bytes(range(256)) * 256  # 64 KiB
            t0 = time.monotonic()
            try:
                while self.sent < self.size:
                    chunk = self.sent.to_bytes(8, "big") + block[8:]
                    chunk = chunk[:self.size - self.sent]
                    h.update(chunk)
                    proc.stdin.write(chunk)
                    self.sent += len(chunk)
                    ahead = self.sent / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self.digest = h.hexdigest()
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()  # a few lines at most
            self.rc, self.out, self.err = proc.wait(), out.decode(), err.decode()

        self._thread = threading.Thread(target=feed, daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float) -> int:
        assert self._thread is not None
        self._thread.join(timeout)
        assert self.rc is not None, f"upload still running after {timeout}s"
        return self.rc


def download(cp: ControlPlane, p: str, dest: Path) -> str:
    """GET the copy path into ``dest``; its sha256."""
    with dest.open("wb") as f:
        subprocess.run(kubectl_argv(cp, None, "get", "--raw", p), stdout=f, check=True,
                       timeout=120)
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def until(ok: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(ok, timeout, what)
