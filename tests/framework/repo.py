"""The source checkout the harness runs from: the one place that finds the repository root.

The harness is not installed anywhere. It needs what sits beside it in a checkout:
``hack/`` (tool versions, binaries, install scripts), ``manifests/`` (the shipped RBAC),
``aggapi/`` (run as ``python3 -m aggapi``) and ``.local/`` (state, caches). So it only
runs from a source checkout, as ``python3 -m tests.framework.<module>`` from the root.
"""

from __future__ import annotations

import os
from pathlib import Path

# tests/framework/repo.py -> the checkout's root.
REPO = Path(__file__).resolve().parents[2]

if not ((REPO / "pyproject.toml").is_file() and (REPO / "hack").is_dir()
        and (REPO / "aggapi").is_dir()):
    raise RuntimeError(f"tests.framework runs from a source checkout of aggapi only; "
                       f"{REPO} has no pyproject.toml, hack/ and aggapi/")


def python_env() -> dict[str, str]:
    """The environment for ``python3 -m aggapi ...`` or ``-m tests.framework...`` children:
    this checkout first on the path (whatever their cwd), output unbuffered for the logs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
