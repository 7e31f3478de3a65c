"""Run the plugins the way users do: through real kubectl, which finds kubectl-<name>
on PATH (here: small launchers of the console-script entry points in a temp bin dir)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import struct
import sys
import termios
from dataclasses import dataclass
from pathlib import Path

from tests.framework.kubetools import binary
from tests.framework.procs import HarnessError
from tests.framework.repo import REPO


def _kubectl() -> str:
    """AGGAPI_KUBECTL_BIN, or AGGAPI_KUBECTL (local-up's env names its kubectl so), else
    the kubectl hack/build-binaries.sh built for the release under test; "" when none is
    built (the plugin tests skip). Never Debian's on PATH: it may be minors behind."""
    if own := os.environ.get("AGGAPI_KUBECTL_BIN") or os.environ.get("AGGAPI_KUBECTL"):
        return own
    try:
        return binary("kubectl", build=False)
    except HarnessError:
        return ""


KUBECTL = _kubectl()
ENTRY_POINTS = {"kubectl-ncp": ("aggapi.plugins.ncp", "main"),
                "kubectl-image_pull_progress": ("aggapi.plugins.image_pull_progress", "main"),
                "kubectl_complete-ncp": ("aggapi.plugins.complete", "ncp_main"),
                "kubectl_complete-image_pull_progress": ("aggapi.plugins.complete",
                                                         "image_pull_progress_main")}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def install_plugins(bin_dir: Path) -> None:
    """What ``pip install`` puts on PATH for the plugins' console scripts."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, (module, func) in ENTRY_POINTS.items():
        p = bin_dir / name
        p.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\n"
                     f"sys.exit({func}())\n")
        p.chmod(0o755)


def plugin_env(bin_dir: Path, kubeconfig: Path | str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["KUBECONFIG"] = str(kubeconfig)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env


@dataclass
class Run:
    rc: int
    out: str
    err: str


async def kubectl(env: dict[str, str], *args: str, timeout: float = 60) -> Run:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


async def kubectl_pty(env: dict[str, str], *args: str, cols: int = 140,
                      timeout: float = 60) -> Run:
    """Run under a pseudo-terminal; ``out`` is everything drawn on the screen."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols)}
    env.pop("NO_COLOR", None)
    proc = await asyncio.create_subprocess_exec(KUBECTL, *args, env=env, stdin=slave,
                                                stdout=slave, stderr=slave,
                                                start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                return
            if not data:
                return
            chunks.append(data)

    try:
        await asyncio.wait_for(asyncio.gather(asyncio.to_thread(drain), proc.wait()), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
    assert proc.returncode is not None
    return Run(proc.returncode, b"".join(chunks).decode("utf-8", "replace"), "")


def screen_text(raw: str) -> str:
    return ANSI.sub("", raw)
