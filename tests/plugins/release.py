"""Build the plugin release with hack/build-plugins.sh and put its linux-amd64 zipapps on
a PATH the way a user unpacking the archives would, run by an isolated interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.framework.repo import REPO

VERSION = "v9.8.7"
BASE_URL = f"https://releases.example.com/aggapi/{VERSION}"
PLATFORMS = ("linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64")
EXES = {"ncp": "kubectl-ncp", "image-pull-progress": "kubectl-image_pull_progress"}
COMPLETERS = {"ncp": "kubectl_complete-ncp",
              "image-pull-progress": "kubectl_complete-image_pull_progress"}
# The server's stack, which the plugins must not carry (distribution import names).
SERVER_ONLY = ("grpc", "google", "prometheus_client", "jwt", "uvloop", "cryptography",
               "cffi", "kubernetes_asyncio")


def archive(out: Path, plugin: str, platform: str) -> Path:
    os_, arch = platform.split("/")
    return out / f"{EXES[plugin]}-{VERSION}-{os_}-{arch}.tar.gz"


def build(out: Path) -> Path:
    """Run the build script into ``out``; its archives and krew/ manifests land there."""
    subprocess.run(["bash", str(REPO / "hack/build-plugins.sh"), "--version", VERSION,
                    "--base-url", BASE_URL, "--out", str(out)],
                   check=True, timeout=900, stdout=subprocess.DEVNULL)
    return out


def install_zipapps(out: Path, bin_dir: Path, python: Path | None = None, *,
                    completers: bool = False) -> None:
    """Unpack the linux-amd64 archives' zipapps (and, with ``completers``, their
    completion executables) into ``bin_dir``, plus a ``python3`` there that is
    ``python`` (default: this interpreter) run with -I -S: no PYTHONPATH, no user or
    system site-packages (where aggapi is installed), so the zipapp runs on what it
    carries."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for plugin in EXES:
        with tarfile.open(archive(out, plugin, "linux/amd64")) as tar:
            tar.extract(EXES[plugin], bin_dir, filter="data")
            if completers:
                tar.extract(COMPLETERS[plugin], bin_dir, filter="data")
    isolated_python3(bin_dir, python)


def isolated_python3(bin_dir: Path, python: Path | None = None) -> None:
    """A ``python3`` in ``bin_dir`` that runs ``python`` (default: this interpreter)
    with -I -S, for the zipapps' ``#!/usr/bin/env python3``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    py = bin_dir / "python3"
    py.write_text(f'#!/bin/sh\nexec {python or sys.executable} -I -S "$@"\n')
    py.chmod(0o755)


def isolated_env(bin_dir: Path, home: Path, **extra: str) -> dict[str, str]:
    """A bare environment: PATH with ``bin_dir`` first (its python3 for the zipapps'
    ``#!/usr/bin/env python3``), HOME in a temp dir (shiv unpacks into ~/.shiv)."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "HOME": str(home),
            "LANG": "C.UTF-8", **extra}
