"""The Dockerfile: multi-stage, base pinned by digest, non-root by default, and its
install steps work. No Docker engine runs here, so the image is not built: the build
stage's RUN steps are executed as they are in a fresh virtualenv on a copy of the source."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manifests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for ins, args in _instructions():
        if ins == "FROM":
            name = args.split()[-1] if " AS " in args.upper() else str(len(stages))
            current = stages.setdefault(name, [])
        if current is not None:
            current.append((ins, args))
    return stages


def test_multistage_pinned_non_root() -> None:
    ins = _instructions()
    args = dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)
    assert re.search(r"@sha256:[0-9a-f]{64}$", args["PYTHON_IMAGE"]), args["PYTHON_IMAGE"]
    stages = _stages()
    assert list(stages) == ["build", "runtime"]
    runtime = stages["runtime"]
    assert runtime[0][1].startswith("${PYTHON_IMAGE}")
    assert any(i == "COPY" and a.startswith("--from=build ") for i, a in runtime)
    user = [a for i, a in runtime if i == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ("ENTRYPOINT", '["aggapi"]') in runtime
    assert not [a for i, a in runtime if i == "RUN"], "the runtime stage installs nothing"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    assert {"!pyproject.toml", "!README.md", "!aggapi/"} <= set(lines)


@pytest.mark.slow
def test_build_stage_install_steps_work_in_a_fresh_venv(tmp_path: Path) -> None:
    build = _stages()["build"]
    src = tmp_path / "src"
    src.mkdir()
    for ins, args in build:
        if ins == "COPY":
            *sources, dest = args.split()
            for s in sources:
                into_dir = dest.endswith("/") or dest == "." or len(sources) > 1
                target = src / dest / Path(s).name if into_dir else src / dest
                if (REPO / s).is_dir():
                    shutil.copytree(REPO / s, target,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / s, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    for ins, args in build:
        if ins == "ENV":
            for m in re.finditer(r"(\w+)=(\S+)", args):
                env[m.group(1)] = m.group(2)
    env["VENV"] = str(tmp_path / "venv")  # /opt/aggapi in the image
    # `python` in the image is the base image's interpreter: here, the one running pytest.
    pybin = tmp_path / "pybin"
    pybin.mkdir()
    (pybin / "python").symlink_to(sys.executable)
    env["PATH"] = f"{pybin}{os.pathsep}{env.get('PATH', '')}"
    runs = [a for i, a in build if i == "RUN"]
    assert runs
    for cmd in runs:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=src, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"RUN {cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = subprocess.run([str(tmp_path / "venv/bin/aggapi"), "--help"], capture_output=True,
                         text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "apiserver" in out.stdout and "agent" in out.stdout
    # Both entry points import from the installed copy, not from the source tree.
    for sub in ("apiserver", "agent"):
        r = subprocess.run([str(tmp_path / "venv/bin/aggapi"), sub, "--help"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin"}, timeout=120)
        assert r.returncode == 0, f"aggapi {sub} --help:\n{r.stderr[-2000:]}"
