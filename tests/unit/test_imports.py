"""The direction of every import: no circles, the library below the services, the services
beside each other, and no function-level import without a reason.

Read from the source with `ast` (nothing is imported), so the rules hold for every module,
including those no test loads.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from boomerang_cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
# Import roots: the library, each service, the CLI (composition root) and the tools.
SOURCES = {
    "boomerang": ROOT / "libs",
    "boomerang_registry": ROOT / "services/registry",
    "boomerang_router": ROOT / "services/router",
    "boomerang_gateway": ROOT / "services/gateway",
    "boomerang_reaper": ROOT / "services/reaper",
    "boomerang_cli": ROOT / "services/cli",
    "boomerang_tools": ROOT / "tools",
}
SERVICES = {"boomerang_registry", "boomerang_router", "boomerang_gateway", "boomerang_reaper"}


def modules() -> dict[str, Path]:
    """Every first-party module (generated stubs excluded) by dotted name."""
    out: dict[str, Path] = {}
    for top, base in SOURCES.items():
        for path in sorted((base / top).rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            if "v1" in rel.parts[:2] and top == "boomerang":
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


MODULES = modules()


def imported(name: str, path: Path) -> Iterator[tuple[str, ast.stmt]]:
    """The first-party modules `name` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield from _known(sub if sub in MODULES else base, node)


def _known(target: str, node: ast.stmt) -> Iterator[tuple[str, ast.stmt]]:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    if target:
        yield target, node


def graph() -> dict[str, set[str]]:
    edges = {name: {t for t, _ in imported(name, path) if t != name} for name, path in MODULES.items()}
    # `boomerang_cli.main` imports each command's module by name (importlib, so that one
    # command loads only its own): edges all the same, which the rules below must see.
    edges["boomerang_cli.main"] |= set(COMMANDS.values())
    return edges


def test_the_scan_sees_the_commands_dispatched_by_name() -> None:
    assert set(COMMANDS.values()) <= MODULES.keys()
    assert "boomerang_tools.demo.cli" in graph()["boomerang_cli.main"]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges without those into a package's own `__init__` (importing `a.b.c` runs `a.b`'s
    `__init__`, which is no dependency of `a.b.c`'s code)."""
    return {v: {w for w in ws if not v.startswith(w + ".")} for v, ws in edges.items()}


def test_the_scan_sees_the_tree() -> None:
    assert "boomerang.resilience" in MODULES and "boomerang_router.planner" in MODULES
    assert "boomerang_router.registry_api" in graph()["boomerang_router.planner"]


def test_no_import_circles() -> None:
    assert cycles(_package_edges(graph())) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_a_service_or_a_tool() -> None:
    bad = {(v, w) for v, ws in graph().items() if v.split(".")[0] == "boomerang" for w in ws
           if w.split(".")[0] != "boomerang"}
    assert bad == set()


def test_only_the_command_table_reaches_the_tools() -> None:
    """The tools are the top layer (an optional extra's worth): the library, the services and
    the CLI's own commands never import them; `boomerang_cli.main` lists their commands."""
    bad = {(v, w) for v, ws in graph().items() for w in ws
           if w.split(".")[0] == "boomerang_tools" and v.split(".")[0] != "boomerang_tools" and v != "boomerang_cli.main"}
    assert bad == set()


def test_no_service_imports_another() -> None:
    bad = {(v, w) for v, ws in graph().items() for w in ws
           if v.split(".")[0] in SERVICES and w.split(".")[0] in SERVICES and w.split(".")[0] != v.split(".")[0]}
    assert bad == set()


# A service's conductor (the module that runs a plan or a turn top to bottom) is imported only
# by the modules that serve it; nothing it calls sits above it for a type it happens to hold.
CONDUCTORS = {
    "boomerang_router.planner": {"boomerang_router.server", "boomerang_router.servicer"},
    "boomerang_gateway.turn": {"boomerang_gateway.app", "boomerang_gateway.server", "boomerang_gateway.tracing"},
}


def test_only_the_serving_modules_import_a_conductor() -> None:
    edges = graph()
    for conductor, allowed in CONDUCTORS.items():
        assert {v for v, ws in edges.items() if conductor in ws} <= allowed, conductor


def function_imports(source: str) -> Iterator[tuple[ast.stmt, bool]]:
    """Each import inside a function, and whether it says why it is deferred: a `# deferred:`
    comment on it or in the comment lines right above, or it follows such an import directly."""
    lines = source.split("\n")

    def marked(node: ast.stmt) -> bool:
        if any("# deferred" in s for s in lines[node.lineno - 1 : node.end_lineno]):
            return True
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            if lines[i].strip().startswith("# deferred"):
                return True
            i -= 1
        return False

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.stmt, bool]]:
        for value in ast.iter_fields(node):
            children = value[1] if isinstance(value[1], list) else [value[1]]
            group = False
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    group = group or marked(child)
                    if in_function:
                        yield child, group
                elif isinstance(child, ast.stmt):
                    group = False
                yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from walk(ast.parse(source), False)


def test_function_level_imports_say_why() -> None:
    undeferred = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in MODULES.values()
        for node, deferred in function_imports(path.read_text())
        if not deferred
    ]
    assert undeferred == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    import os\n", [False]),
        ("def f():\n    # deferred: optional\n    import a\n    import b\n    x = 1\n    import c\n", [True, True, False]),
        ("import os\n", []),
    ],
)
def test_function_import_rule(source: str, expected: list[bool]) -> None:
    assert [d for _, d in function_imports(source)] == expected


def test_each_command_maps_to_the_module_that_adds_it() -> None:
    """`boomerang X` imports only COMMANDS[X]; that module must add X (and every module's commands
    must be listed, or they would be missing when another command runs)."""
    for module in set(COMMANDS.values()):
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert {c for c, m in COMMANDS.items() if m == module} == set(sub.choices), module
    assert build_parser("registry").parse_args(["registry", "--listen", "127.0.0.1:1"]).command == "registry"
