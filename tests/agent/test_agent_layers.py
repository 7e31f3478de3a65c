"""The agent package's layer rule (docs/architecture.md), read from the source.

main -> app (the composition root) -> the HTTP handlers of each engine -> the
engines (progress, copy), which never import each other; config, auth, metrics
and kubeletconfig sit below the handlers. pullmetrics, beside the handlers, turns the
progress engine's node states into metrics. No agent module imports the apiserver,
the client or the plugins, and the agent's import graph has no loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "aggapi"
AGENT = "aggapi.agent"
LEAVES = ("aggapi.agent.auth", "aggapi.agent.metrics", "aggapi.agent.kubeletconfig",
          "aggapi.agent.health")

# module (or package prefix ending in '.') -> agent modules it may import
# (prefixes ending in '.' allow a whole package).
RULES: dict[str, tuple[str, ...]] = {
    "aggapi.agent.main": ("aggapi.agent.app", "aggapi.agent.auth", "aggapi.agent.config"),
    "aggapi.agent.app": ("aggapi.agent.auth", "aggapi.agent.config", "aggapi.agent.metrics",
                         "aggapi.agent.health", "aggapi.agent.pullmetrics",
                         "aggapi.agent.kubeletconfig", "aggapi.agent.progress.",
                         "aggapi.agent.copy."),
    "aggapi.agent.config": ("aggapi.agent.copy.quotas", "aggapi.agent.kubeletconfig"),
    "aggapi.agent.progress.handlers": ("aggapi.agent.progress.", "aggapi.agent.auth",
                                       "aggapi.agent.kubeletconfig"),
    "aggapi.agent.copy.handlers": ("aggapi.agent.copy.", "aggapi.agent.auth"),
    "aggapi.agent.pullmetrics": ("aggapi.agent.metrics", "aggapi.agent.kubeletconfig",
                                 "aggapi.agent.progress."),
    "aggapi.agent.progress.": ("aggapi.agent.progress.",),
    "aggapi.agent.copy.": ("aggapi.agent.copy.",),
    **{leaf: () for leaf in LEAVES},
}
FORBIDDEN = ("aggapi.apiserver", "aggapi.client", "aggapi.plugins", "aggapi.testing")


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every aggapi module ``path`` imports (``from pkg import sub`` names pkg.sub)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("aggapi"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("aggapi"):
                continue
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [s for s in subs if s in known]
            # Names that are not submodules are attributes of the module itself.
            if len(found) < len(subs):
                yield node.module
            yield from found


def rule_for(module: str) -> tuple[str, ...] | None:
    if module in RULES:
        return RULES[module]
    prefixes = [p for p in RULES if p.endswith(".") and (module + ".").startswith(p)]
    return RULES[max(prefixes, key=len)] if prefixes else None


def allowed(target: str, rule: tuple[str, ...]) -> bool:
    return any(target.startswith(r) if r.endswith(".") else target == r for r in rule)


def agent_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: set(imports(p, known)) - {m} for m, p in known.items()
            if m == AGENT or m.startswith(AGENT + ".")}


GRAPH = agent_graph()


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m != AGENT))
def test_module_imports_only_what_its_layer_may(module: str) -> None:
    rule = rule_for(module)
    assert rule is not None, f"{module} has no layer rule: add it to RULES and the docs"
    inside = {t for t in GRAPH[module] if t.startswith(AGENT + ".")}
    # A package's own __init__ (a docstring) is no dependency.
    inside -= {t for t in inside if t in GRAPH and not GRAPH[t]
               and (PKG.parent / t.replace(".", "/") / "__init__.py").exists()}
    assert sorted(t for t in inside if not allowed(t, rule)) == []
    assert sorted(t for t in GRAPH[module] if t.startswith(FORBIDDEN)) == []


def test_the_engines_do_not_import_each_other() -> None:
    for module, targets in GRAPH.items():
        for a, b in (("progress", "copy"), ("copy", "progress")):
            if module.startswith(f"{AGENT}.{a}"):
                assert not [t for t in targets if t.startswith(f"{AGENT}.{b}")], module


def test_no_import_loop() -> None:
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            if seen.get(t) == 1:
                raise AssertionError(" -> ".join([*path[path.index(t):], t]))
            if t in GRAPH and t not in seen:
                visit(t, [*path, t])
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m, [m])
