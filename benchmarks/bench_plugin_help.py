"""``kubectl <plugin> --help`` wall time (issue 14: at most 0.3 s, thanks to lazy imports).

Runs the machine's kubectl, which finds the plugins on PATH: the console-script
launchers ``pip install 'aggapi[plugins]'`` would make (this checkout's aggapi), and,
with ``--dist DIR`` (hack/build-plugins.sh's output), the release's linux-amd64 zipapps
on an isolated interpreter (after one warm-up run: shiv unpacks once into ~/.shiv).

    python3 -m benchmarks.bench_plugin_help [--runs 10] [--dist dist/plugins]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from tests.plugins import release
from tests.plugins.helpers import KUBECTL, install_plugins, plugin_env

GOAL = 0.3


def timed(cmd: list[str], env: dict[str, str], runs: int) -> list[float]:
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # warm-up
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def unpack(dist: Path, bin_dir: Path) -> None:
    """The linux-amd64 archives' plugins (any version) into ``bin_dir``, with the
    isolated ``python3`` of tests/plugins/release.py."""
    bin_dir.mkdir(parents=True)
    for exe in release.EXES.values():
        found = sorted(dist.glob(f"{exe}-v*-linux-amd64.tar.gz"))
        if not found:
            raise SystemExit(f"no {exe}-VERSION-linux-amd64.tar.gz in {dist}")
        with tarfile.open(found[-1]) as tar:
            tar.extract(exe, bin_dir, filter="data")
    py = bin_dir / "python3"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    py.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--dist", type=Path, help="hack/build-plugins.sh --out DIR")
    a = p.parse_args(argv)
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        pip_bin = Path(tmp) / "pip-bin"
        install_plugins(pip_bin)
        setups = [("pip console script", plugin_env(pip_bin, Path(tmp) / "no-kubeconfig"))]
        if a.dist is not None:
            zbin = Path(tmp) / "zipapp-bin"
            unpack(a.dist, zbin)
            setups.append(("release zipapp", release.isolated_env(zbin, Path(tmp) / "home")))
        for what, env in setups:
            for plugin in release.EXES:
                xs = timed([KUBECTL, plugin, "--help"], env, a.runs)
                med = statistics.median(xs)
                worst = max(worst, med)
                print(f"kubectl {plugin} --help ({what}): median {med:.3f} s, "
                      f"min {min(xs):.3f}, max {max(xs):.3f} ({a.runs} runs)")
    print(f"goal: median <= {GOAL} s -> {'met' if worst <= GOAL else 'MISSED'}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
