"""Modules run with ``python3 -m`` (the harness's CLIs): the ``__main__`` guard must be the
last top-level statement, or whatever is defined after it is missing when run that way
(imports and tests never see the difference)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.framework.repo import REPO

# The product's CLIs and the harness's (tests/framework: controlplane, node, kubelet, demo).
MAINS = sorted(p for d in (REPO / "aggapi", REPO / "tests/framework") for p in d.rglob("*.py")
               if 'if __name__ == "__main__"' in p.read_text())


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def test_there_are_runnable_modules() -> None:
    assert len(MAINS) >= 4  # controlplane, node, kubelet, demo at least


@pytest.mark.parametrize("path", MAINS, ids=lambda p: str(p.relative_to(REPO)))
def test_main_guard_comes_last(path: Path) -> None:
    body = ast.parse(path.read_text()).body
    guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
    after = [type(n).__name__ for n in body[guards[-1] + 1:]] if guards else []
    assert guards and not after, f"{path}: statements after the __main__ guard: {after}"
