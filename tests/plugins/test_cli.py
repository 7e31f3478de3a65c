"""Both plugins start without a cluster: --help works, and a broken kubeconfig is one
clean error line (a ConfigError from aggapi.client), not another library's traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from aggapi.plugins import image_pull_progress, ncp

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["aggapi.plugins.ncp", "aggapi.plugins.image_pull_progress"])
def test_help(module: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: kubectl ") and "--kubeconfig" in r.stdout
    for flag in ("--as-group", "--token", "--server", "--certificate-authority",
                 "--insecure-skip-tls-verify", "--cluster", "--user", "--request-timeout",
                 "--v", "exit status:"):
        assert flag in r.stdout, flag


@pytest.mark.parametrize(("module", "says"), [
    ("aggapi.plugins.ncp", ("-c CONTAINER", "--retries N", "--no-preserve",
                            "kubectl.kubernetes.io/default-container",
                            "working directory", "Defaulted container")),
    ("aggapi.plugins.image_pull_progress", ("deployment/NAME", "statefulset/",
                                            "daemonset/", "job/", "-l SELECTOR", "-A",
                                            "--node NODE", "--fail-fast",
                                            "stuck first", "--max-rows",
                                            "podimagepulls")),
])
def test_help_documents_kubectls_behaviour(module: str, says: tuple[str, ...]) -> None:
    """What issue 14 asks the help to say: ncp's kubectl cp flags and default container,
    image-pull-progress's targets, ordering and --fail-fast."""
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, env={"COLUMNS": "100", "PATH": ""})
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    missing = [s for s in says if " ".join(s.split()) not in flat]
    assert missing == [], r.stdout


@pytest.mark.parametrize("module", ["aggapi.plugins.ncp", "aggapi.plugins.image_pull_progress"])
def test_help_imports_no_client_library(module: str) -> None:
    """--help stays fast by importing neither aiohttp, yaml nor rich (lazy imports)."""
    code = (f"import sys; sys.argv = ['k', '--help']\nfrom {module} import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('aiohttp', 'rich', 'yaml', 'aggapi.client') "
            "if m in sys.modules), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "usage: kubectl" in r.stdout, r.stderr
    assert r.stderr.strip() == "[]"


@pytest.mark.parametrize(("main", "args"), [
    (ncp.main, ["web:/data/x", "{tmp}/x"]),
    (image_pull_progress.main, ["web"]),
])
def test_unreadable_kubeconfig_is_one_error_line(
        main: Callable[[list[str]], int], args: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    rc = main(["--kubeconfig", str(missing), *[a.format(tmp=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith(f"error: cannot read kubeconfig {missing}"), err
    assert "Traceback" not in err
