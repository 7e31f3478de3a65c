"""A real docker-registry (Debian's distribution 2.8) on 127.0.0.1 for tests.

Synchronous on purpose: it is a subprocess with no event-loop affinity, so a
session-scoped fixture can share it with tests running on any loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from tests.framework.procs import free_port, start_logged

BINARY = "/usr/bin/docker-registry"


class Registry:
    """``docker-registry serve`` with temp storage on a free 127.0.0.1 port."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None, *,
                 binary: str = BINARY, port: int | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="aggapi-registry-"))
        self.binary = binary
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the registry host part of image references."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def _write_config(self) -> Path:
        storage = self.workdir / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "config.yml"
        cfg.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {storage}\n"
            "  delete:\n    enabled: true\n"
            "  redirect:\n    disable: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
        )
        return cfg

    def start(self, timeout: float = 15.0) -> None:
        if not Path(self.binary).exists():
            raise FileNotFoundError(f"{self.binary} missing: run hack/install-deps.sh")
        cfg = self._write_config()
        self.proc = start_logged([self.binary, "serve", str(cfg)], self.workdir / "registry.log",
                                 what=f"docker-registry on {self.host}", ready=self._ready,
                                 log_tail=self.log_tail, timeout=timeout)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/", timeout=1) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, n: int = 2000) -> str:
        p = self.workdir / "registry.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self._own_dir:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.workdir)

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
