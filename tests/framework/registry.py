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
HTPASSWD = "/usr/bin/htpasswd"  # apache2-utils (hack/install-deps.sh)


def config_yaml(storage: Path, addr: str, *, htpasswd: Path | None = None) -> str:
    """docker-registry's config: filesystem storage, deletes allowed, blobs served by the
    registry itself (no redirects); with ``htpasswd``, basic auth against that file."""
    auth = (f"auth:\n  htpasswd:\n    realm: aggapi-test\n    path: {htpasswd}\n"
            if htpasswd is not None else "")
    return ("version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {storage}\n"
            "  delete:\n    enabled: true\n"
            "  redirect:\n    disable: true\n"
            f"{auth}"
            f"http:\n  addr: {addr}\n")


def write_htpasswd(path: Path, user: str, password: str) -> None:
    """An htpasswd file with one bcrypt entry (the only hash docker-registry 2.8 takes)."""
    if not Path(HTPASSWD).exists():
        raise FileNotFoundError(f"{HTPASSWD} missing: run hack/install-deps.sh (apache2-utils)")
    r = subprocess.run([HTPASSWD, "-niB", user], input=password, capture_output=True,
                       text=True, check=True, timeout=30)
    path.write_text(r.stdout)
    path.chmod(0o600)


def registry_answers(host: str) -> bool:
    """``/v2/`` answers: 200, or 401 from a registry that wants credentials."""
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=1) as r:
            return int(r.status) == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except (urllib.error.URLError, OSError):
        return False


class Registry:
    """``docker-registry serve`` with temp storage on a free 127.0.0.1 port; with
    ``auth`` (user, password), only that user may pull or push (htpasswd)."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None, *,
                 binary: str = BINARY, port: int | None = None,
                 auth: tuple[str, str] | None = None) -> None:
        self.auth = auth
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
        htpasswd = None
        if self.auth is not None:
            htpasswd = self.workdir / "htpasswd"
            write_htpasswd(htpasswd, *self.auth)
        cfg.write_text(config_yaml(storage, f"127.0.0.1:{self.port}", htpasswd=htpasswd))
        return cfg

    def start(self, timeout: float = 15.0) -> None:
        if not Path(self.binary).exists():
            raise FileNotFoundError(f"{self.binary} missing: run hack/install-deps.sh")
        cfg = self._write_config()
        self.proc = start_logged([self.binary, "serve", str(cfg)], self.workdir / "registry.log",
                                 what=f"docker-registry on {self.host}", ready=self._ready,
                                 log_tail=self.log_tail, timeout=timeout)

    def _ready(self) -> bool:
        return registry_answers(self.host)

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
