"""The product's import graph: no loops anywhere in ``aggapi``, and the
apiserver's layers only import downwards.

The graph is read from the source (ast), module-level imports only, those under
``if TYPE_CHECKING:`` included: a loop that only type checkers see is still a
loop in the design. Imports inside functions are not edges (they run later).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "aggapi"
EXCLUDED = ("aggapi.proto",)  # generated protobuf code



def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not name.startswith(EXCLUDED):
            out[name] = path
    return out


def _top_level(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run at import time (or under TYPE_CHECKING)."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try):
            stack.extend(node.body)
            stack.extend(node.orelse)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    stack.extend(handler.body)
                stack.extend(node.finalbody)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in _top_level(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` imports the submodule when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _cycle_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete loop through a component, for the failure message."""
    members = set(comp)
    path = [comp[0]]
    seen = {comp[0]: 0}
    while True:
        nxt = sorted(graph[path[-1]] & members)[0]
        if nxt in seen:
            return [*path[seen[nxt]:], nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def test_finder_sees_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert _cycle_in(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_loops() -> None:
    graph = import_graph()
    loops = strongly_connected(graph)
    assert not loops, "import loops: " + "; ".join(
        " -> ".join(_cycle_in(graph, c)) for c in loops)


# The apiserver's layers, bottom up. A module may import the apiserver modules of
# lower layers; within a layer only its own package (the foundation is one
# package for this purpose: small parts that build on each other).
AP = "aggapi.apiserver."
LAYERS: list[set[str]] = [
    {"user", "requestinfo", "config", "metrics", "shutdown", "pods", "agents", "apischemas",
     "agentclient", "authconfig", "discovery", "openapi", "health", "shared",
     "podsources", "podslim", "election", "handover",
     "fieldselector"},  # foundation
    {"authn", "authz"},                      # the authentication and authorization layer
    {"handlers", "imagepullprogress", "replicas"},  # the subresources: never authorize
    {"collections"},                         # the collections, on the merge policy
    {"mirror"},                              # a follower's standby of the collections
    {"parts"},                               # Complete(): builds every part
    {"routes"},                              # the route table and its authorization
    {"app"},                                 # New(): middlewares, routes, background
    {"main"},
]


def _layer(module: str) -> tuple[int, str]:
    top = module.removeprefix(AP).split(".")[0]
    for level, names in enumerate(LAYERS):
        if top in names:
            return level, top
    raise AssertionError(f"{module} is in no apiserver layer: add it to LAYERS")


def test_apiserver_layers_import_downwards() -> None:
    graph = import_graph()
    wrong = []
    for module, targets in graph.items():
        if not module.startswith(AP):
            continue
        level, top = _layer(module)
        for target in targets:
            if not target.startswith(AP):
                continue
            t_level, t_top = _layer(target)
            if t_level > level or (t_level == level and level > 0 and t_top != top):
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_layers_see_every_import() -> None:
    # The graph must see what it checks: the app is built from the route table.
    graph = import_graph()
    assert "aggapi.apiserver.routes" in graph["aggapi.apiserver.app"]
    assert "aggapi.apiserver.requestinfo" in graph["aggapi.apiserver.authz"]


# Which product package may import which (module-level imports). "shared" is every
# module at the root of aggapi (wire, status, ...) and every subpackage grouping one
# concern (kube, auth, tls, tar, fs, serve): the pieces both sides of a wire use. The
# two servers never import each other, the client and plugins never import a server,
# and nothing imports the plugins.
ENTRY_POINTS = {"aggapi.cli", "aggapi.__main__"}  # they start a server, lazily
PACKAGE_RULES: dict[str, set[str]] = {
    "shared": {"aggapi", "shared"},
    "runtime": {"aggapi", "shared", "runtime", "proto"},
    "agent": {"aggapi", "shared", "runtime", "proto", "agent"},
    "apiserver": {"aggapi", "shared", "apiserver"},
    "client": {"aggapi", "shared", "client"},
    "plugins": {"aggapi", "shared", "client", "plugins"},
    "entry": {"aggapi", "shared", "entry"},
}


def _package(module: str) -> str:
    if module in ENTRY_POINTS:
        return "entry"
    parts = module.split(".")
    if len(parts) == 1:
        return "aggapi"
    if parts[1] in PACKAGE_RULES or parts[1] == "proto":
        return parts[1]
    return "shared"


def test_packages_import_only_what_their_layer_allows() -> None:
    wrong = [f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
             if _package(m) != "aggapi" and _package(t) not in PACKAGE_RULES[_package(m)]]
    assert not wrong, wrong


def test_package_rule_sees_a_violation() -> None:
    # The rule is not vacuous: an agent module importing the apiserver is caught.
    assert _package("aggapi.apiserver.authz") not in PACKAGE_RULES[
        _package("aggapi.agent.app")]
    assert _package("aggapi.wire") == "shared" and _package("aggapi.cli") == "entry"


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _documented(row_start: str) -> list[str]:
    """The backticked plain names in the second cell of the architecture page's package
    table rows that start with ``row_start``."""
    rows = [line for line in ARCHITECTURE.read_text().splitlines() if line.startswith(row_start)]
    assert rows, f"no row {row_start!r} in {ARCHITECTURE}"
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[2])]


def _shared_subpackages() -> dict[str, Path]:
    return {name: path for name, path in _modules().items()
            if path.name == "__init__.py" and name.count(".") == 1
            and _package(name + ".x") == "shared"}


def test_root_holds_only_the_documented_cross_cutting_modules() -> None:
    # A module belonging to one concern goes in that concern's subpackage; the root keeps
    # what the architecture page lists as cross-cutting, and the entry points.
    root = {name.removeprefix("aggapi.") for name, path in _modules().items()
            if name.count(".") == 1 and path.parent == PACKAGE}
    documented = set(_documented("| shared: root modules"))
    documented |= {e.removeprefix("aggapi.") for e in ENTRY_POINTS}
    assert root == documented


def test_shared_subpackages_are_documented_and_import_nothing() -> None:
    # Importing aggapi.kube.kubeconfig (the plugins) must not load the rest of aggapi.kube.
    subpackages = _shared_subpackages()
    assert {"aggapi.kube", "aggapi.tls"} <= set(subpackages)
    for name, path in subpackages.items():
        assert _documented(f"| shared: `{name.replace('.', '/')}`"), name
        body = ast.parse(path.read_text()).body
        assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                   for node in body), f"{path} should hold only its docstring"
