"""The harness's modules import each other without a loop, and only at module level
(a function-local import is how a loop gets hidden)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from tests.framework.repo import REPO

FRAMEWORK = REPO / "tests/framework"
PREFIX = "tests.framework"
MODULES = sorted(FRAMEWORK.glob("*.py"))


def _name(path: Path) -> str:
    return PREFIX if path.stem == "__init__" else f"{PREFIX}.{path.stem}"


def _imports(node: ast.AST) -> list[str]:
    """Modules of tests.framework that an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith(PREFIX)]
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
        # ``from tests.framework import oci`` imports the submodule oci.
        if node.module == PREFIX:
            return [f"{PREFIX}.{a.name}" for a in node.names]
        return [node.module]
    return []


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    return {_name(p): {m for n in ast.walk(ast.parse(p.read_text())) for m in _imports(n)}
            for p in paths}


def local_imports(path: Path) -> list[str]:
    """``line: statement`` of each import inside a function or class body."""
    scopes = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    found: list[str] = []

    def visit(node: ast.AST, nested: bool) -> None:
        if nested and isinstance(node, ast.Import | ast.ImportFrom):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, nested or isinstance(node, scopes))

    visit(ast.parse(path.read_text()), False)
    return found


def test_the_harness_is_there() -> None:
    names = {_name(p) for p in MODULES}
    assert {f"{PREFIX}.controlplane", f"{PREFIX}.node", f"{PREFIX}.kubelet"} <= names


def test_no_import_loop() -> None:
    graph = import_graph(MODULES)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        raise AssertionError(f"import loop in the harness: {err.args[1]}") from None
    # Dependencies first: the node builds on the control plane, not the other way round.
    assert order.index(f"{PREFIX}.controlplane") < order.index(f"{PREFIX}.node")


def test_imports_at_module_level_only() -> None:
    offenders = {str(p.relative_to(REPO)): local_imports(p) for p in MODULES}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_checks_see_a_loop_and_a_local_import(tmp_path: Path) -> None:
    """Both checks flag what they look for (the old controlplane <-> node pair)."""
    (tmp_path / "controlplane.py").write_text(
        "def down() -> None:\n    from tests.framework.node import Node\n")
    (tmp_path / "node.py").write_text("from tests.framework.controlplane import ControlPlane\n")
    paths = sorted(tmp_path.glob("*.py"))
    graph = import_graph(paths)
    assert graph == {f"{PREFIX}.controlplane": {f"{PREFIX}.node"},
                     f"{PREFIX}.node": {f"{PREFIX}.controlplane"}}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError:
        pass
    else:
        raise AssertionError("the loop was not detected")
    assert local_imports(tmp_path / "controlplane.py") == [
        "2: from tests.framework.node import Node"]
