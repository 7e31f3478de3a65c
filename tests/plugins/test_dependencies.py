"""The servers install with only what they import; the plugins' extras stay out of them.

The image installs ``aggapi[server]``, so no module the server entry points import
may come from outside the core dependencies and the ``server`` extra (and their own
requirements); rich belongs to the ``plugins`` extra only, and the core dependencies
(what a plugin install gets) hold none of the servers' stack.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ENTRY_POINTS = ("aggapi.cli", "aggapi.apiserver.main", "aggapi.agent.main")
PLUGIN_ONLY = {"rich", "kubernetes-asyncio"}  # the latter: no longer used anywhere
# grpc looks for these and goes on without them when they are not installed.
OPTIONAL_IMPORTS = {"grpc_tools", "grpc_health", "grpc_reflection"}


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def core_dependencies() -> set[str]:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    return {dist_name(r) for r in project["dependencies"]}


def extra(name: str) -> set[str]:
    extras = pyproject()["project"]["optional-dependencies"]  # type: ignore[index]
    return {dist_name(r) for r in extras[name]}


def closure(names: set[str]) -> set[str]:
    """``names`` and everything they require (without extras), as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [dist_name(r) for r in reqs if "extra ==" not in r.replace("'", '"')]
    return seen


def imported(*modules: str) -> set[str]:
    """Top-level modules loaded by a fresh interpreter after importing ``modules``."""
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120, cwd=ROOT).stdout
    return set(json.loads(out))


def server_modules() -> set[str]:
    # Minus what the interpreter loads by itself (site hooks of installed packages).
    return imported(*SERVER_ENTRY_POINTS) - imported()


def test_core_dependencies_leave_out_the_plugins_libraries() -> None:
    assert not (core_dependencies() | extra("server")) & PLUGIN_ONLY
    assert extra("plugins") >= {"rich"}
    extras = pyproject()["project"]["optional-dependencies"]  # type: ignore[index]
    assert "aggapi[plugins,server]" in extras["test"]


def test_core_dependencies_leave_out_the_server_stack() -> None:
    # The plugins install core + "plugins": none of the servers' libraries.
    assert not core_dependencies() & extra("server")
    assert extra("server") >= {"grpcio", "protobuf", "cryptography", "uvloop"}


def test_server_entry_points_import_no_plugin_library() -> None:
    mods = server_modules()
    assert "aggapi" in mods
    assert not mods & {"rich", "kubernetes_asyncio", "kubernetes"}


def test_server_imports_come_from_core_and_server_dependencies() -> None:
    mods = server_modules()
    allowed = closure(core_dependencies() | extra("server"))
    by_module = metadata.packages_distributions()
    outside = {}
    for mod in mods - {"aggapi"} - OPTIONAL_IMPORTS:
        dists = {dist_name(d) for d in by_module.get(mod, [])}
        if dists and not dists & allowed:
            outside[mod] = sorted(dists)
    if not allowed - core_dependencies():
        pytest.skip("core dependencies are not installed here")
    assert outside == {}
