"""The benchmarks' modules import one another without a cycle (function-level imports
included): a cycle makes which module finishes first depend on which one a caller
happens to import."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _imports(path: Path) -> set[str]:
    """The ``benchmarks.*`` modules one file imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "benchmarks":
                out |= {f"benchmarks.{a.name}" for a in node.names}
            elif node.module.startswith("benchmarks."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("benchmarks.")}
    return out


def _graph() -> dict[str, set[str]]:
    return {f"benchmarks.{p.stem}": _imports(p) for p in sorted(BENCH.glob("*.py"))}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(mod: str, stack: list[str]) -> list[str] | None:
        if mod in stack:
            return [*stack[stack.index(mod):], mod]
        if mod in done:
            return None
        for dep in sorted(graph.get(mod, ())):
            if (found := visit(dep, [*stack, mod])) is not None:
                return found
        done.add(mod)
        return None

    for mod in graph:
        if (found := visit(mod, [])) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_the_benchmarks() -> None:
    graph = _graph()
    assert "benchmarks._installed" in graph
    assert _cycle(graph) is None
