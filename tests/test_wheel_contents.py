"""The wheel ships the product only: ``aggapi/`` and its dist-info, never the harness
(tests/framework), the tests, the benchmarks, hack/ or a conftest.

The wheel is built from a copy of the checkout (a build writes build/ and *.egg-info into
its source tree); a second build, with a harness planted back inside the package, shows
that the check catches one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.framework.repo import REPO

pytestmark = pytest.mark.slow

PACKAGE = "aggapi"
# The dist-info: metadata files and the LICENSE setuptools copies from the root.
DIST_INFO = re.compile(rf"^{PACKAGE}-[^/]+\.dist-info/([^/]+|licenses/LICENSE)$")
# Path parts that mark test or harness code, wherever they sit.
NOT_PRODUCT = {"tests", "test", "testing", "framework", "benchmarks", "hack", "conftest.py"}
TEST_MODULE = re.compile(r"^(test_.*|.*_test)\.py$")
# Not part of the source: caches and earlier builds.
SKIP = shutil.ignore_patterns(".git", ".local", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.pyc")


def foreign(names: list[str]) -> list[str]:
    """Entries of a wheel that are not product files of ``aggapi/`` or its dist-info."""
    out = []
    for name in names:
        if DIST_INFO.match(name):
            continue
        parts = PurePosixPath(name).parts
        if (parts[0] == PACKAGE and not NOT_PRODUCT & set(parts)
                and not TEST_MODULE.match(parts[-1])):
            continue
        out.append(name)
    return out


def copy_checkout(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=SKIP, symlinks=True)
    return dest


def build_wheel(src: Path, out: Path) -> list[str]:
    """``pip wheel`` of ``src``; the wheel's entry names. Without build isolation when
    setuptools is new enough here (no network), else pip fetches it (PyPI)."""
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q",
            "-w", str(out), str(src)]
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 0
    if major >= 68 and importlib.util.find_spec("wheel") is not None:
        argv.insert(argv.index("--no-deps"), "--no-build-isolation")
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=src)
    assert cp.returncode == 0, f"pip wheel failed:\n{cp.stdout}\n{cp.stderr}"
    wheels = list(out.glob(f"{PACKAGE}-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        return [n for n in zf.namelist() if not n.endswith("/")]


_EXT = re.compile(r"\.cpython-[^/]*\.so$")


def product_sources(src: Path) -> set[str]:
    """The product's modules in a checkout, as wheel entry names."""
    return {p.relative_to(src).as_posix() for p in (src / PACKAGE).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_wheel_holds_the_product_and_nothing_else(tmp_path: Path) -> None:
    src = copy_checkout(tmp_path / "src")
    names = build_wheel(src, tmp_path / "wheel")
    stray = foreign(names)
    assert not stray, f"the wheel ships more than the product: {stray}"
    shipped = {n for n in names if n.startswith(f"{PACKAGE}/")}
    # Every module of the product is in, and nothing that is not in the source's aggapi/.
    missing = product_sources(src) - shipped
    assert not missing, f"product modules missing from the wheel: {sorted(missing)}"
    # A compiled module counts as its C source (built where a compiler is, setup.py).
    strangers = {n for n in shipped if not (src / n).is_file()
                 and not (src / _EXT.sub(".c", n)).is_file()}
    assert not strangers, f"wheel entries not in {PACKAGE}/: {sorted(strangers)}"
    assert f"{PACKAGE}/py.typed" in shipped
    top = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    with zipfile.ZipFile(next((tmp_path / "wheel").glob("*.whl"))) as zf:
        assert zf.read(top).decode().split() == [PACKAGE]


def test_a_harness_inside_the_package_is_caught(tmp_path: Path) -> None:
    """The old layout (the harness as aggapi.testing) and a stray conftest fail the check."""
    src = copy_checkout(tmp_path / "src")
    planted = src / PACKAGE / "testing"
    shutil.copytree(src / "tests/framework", planted, ignore=SKIP)
    (src / PACKAGE / "conftest.py").write_text('"""A stray conftest."""\n')
    (src / PACKAGE / "apiserver/test_stray.py").write_text('"""A stray test."""\n')
    names = build_wheel(src, tmp_path / "wheel")
    expected = sorted([*(f"{PACKAGE}/testing/{p.name}" for p in planted.glob("*.py")),
                       f"{PACKAGE}/conftest.py", f"{PACKAGE}/apiserver/test_stray.py"])
    assert sorted(foreign(names)) == expected
