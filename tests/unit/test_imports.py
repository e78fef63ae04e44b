"""The direction of every import: no circles, the library below the services, the services
beside each other, and no function-level import without a reason.

Read from the source with `ast` (nothing is imported), so the rules hold for every module,
including those no test loads.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from boomerang_cli.main import COMMAND_GROUP, TOOL_COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
# Import roots: the client library (wire and clients), the services' library, each service, the
# CLI (composition root), the vLLM hook and the tools.
SOURCES = {
    "boomerang": ROOT / "client",
    "boomerang_server": ROOT / "libs",
    "boomerang_registry": ROOT / "services/registry",
    "boomerang_router": ROOT / "services/router",
    "boomerang_gateway": ROOT / "services/gateway",
    "boomerang_reaper": ROOT / "services/reaper",
    "boomerang_cli": ROOT / "services/cli",
    "boomerang_tools": ROOT / "tools",
    "boomerang_vllm_hook": ROOT / "hook/src",
}
SERVICES = {"boomerang_registry", "boomerang_router", "boomerang_gateway", "boomerang_reaper"}
# Each distribution's pyproject.toml and the import roots it ships: the runtime package (the
# library, the services and the CLI) and the tools, a package of their own above it.
DISTRIBUTIONS = {
    ROOT / "client" / "pyproject.toml": {"boomerang"},
    ROOT / "pyproject.toml": set(SOURCES) - {"boomerang", "boomerang_tools", "boomerang_vllm_hook"},
    ROOT / "tools" / "pyproject.toml": {"boomerang_tools"},
    ROOT / "hook" / "pyproject.toml": {"boomerang_vllm_hook"},
}


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
    return {name: {t for t, _ in imported(name, path) if t != name} for name, path in MODULES.items()}


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
    assert "boomerang_router.claims" in graph()["boomerang_router.planner"]


def test_no_import_circles() -> None:
    assert cycles(_package_edges(graph())) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_a_service_or_a_tool() -> None:
    # The client library imports only itself; the services' library only itself and the client's.
    below = {"boomerang": {"boomerang"}, "boomerang_server": {"boomerang", "boomerang_server"},
             "boomerang_vllm_hook": {"boomerang", "boomerang_vllm_hook"}}
    bad = {(v, w) for v, ws in graph().items() if v.split(".")[0] in below for w in ws
           if w.split(".")[0] not in below[v.split(".")[0]]}
    assert bad == set()


def test_nothing_below_the_tools_imports_them() -> None:
    """The tools are the top layer, a distribution of their own: the library, the services and
    the CLI never import them (the CLI finds the tools' commands as entry points)."""
    bad = {(v, w) for v, ws in graph().items() for w in ws
           if w.split(".")[0] == "boomerang_tools" and v.split(".")[0] != "boomerang_tools"}
    assert bad == set()


# Strings that spell a first-party module's name for another reason than importing it.
NAMED_NOT_IMPORTED = {
    # a traceback frame's module prefix ("the database was being talked to")
    ("boomerang_cli.failures", "boomerang_server.db"),
}
MODULE_NAME = re.compile(r"([A-Za-z_][\w.]*)(?::\w+)?")


def module_named(node: ast.AST, loggers: set[int]) -> str | None:
    """The first-party module a string constant spells (`a.b` or `a.b:attr`), if it does."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in loggers:
        return None
    match = MODULE_NAME.fullmatch(node.value)
    return match[1] if match and match[1] in MODULES and match[1] != "boomerang" else None


def test_no_module_names_a_first_party_module_in_a_string() -> None:
    """An import by name (`importlib.import_module("…")`, `python -m …`) is an edge the rules
    above cannot see: no module spells a first-party module's name in a string (a logger's
    name aside)."""
    named = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        loggers = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call)
                   and getattr(call.func, "attr", getattr(call.func, "id", "")) == "getLogger" for arg in call.args}
        named += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"  # type: ignore[attr-defined]
                  for node in ast.walk(tree)
                  if (target := module_named(node, loggers)) and (name, target) not in NAMED_NOT_IMPORTED]
    assert named == []


def test_the_string_rule_sees_an_import_by_name() -> None:
    call = ast.parse('importlib.import_module("boomerang_tools.demo.cli")\n["-m", "boomerang_cli.main"]')
    found = {module_named(n, set()) for n in ast.walk(call)}
    assert {"boomerang_tools.demo.cli", "boomerang_cli.main"} <= found
    assert module_named(ast.Constant("boomerang: a log line"), set()) is None


def test_no_service_imports_another() -> None:
    bad = {(v, w) for v, ws in graph().items() for w in ws
           if v.split(".")[0] in SERVICES and w.split(".")[0] in SERVICES and w.split(".")[0] != v.split(".")[0]}
    assert bad == set()


# A service's conductor (the module that runs a plan or a turn top to bottom) is imported only
# by the modules that serve it; nothing it calls sits above it for a type it happens to hold.
CONDUCTORS = {
    "boomerang_router.planner": {"boomerang_router.server", "boomerang_router.rpc_surface"},
    "boomerang_gateway.turn": {"boomerang_gateway.app", "boomerang_gateway.server"},
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


def declared_commands() -> dict[str, tuple[str, Path]]:
    """Each `boomerang.commands` entry point the pyproject.toml files declare: its name, and
    its target with the file that declares it."""
    found: dict[str, tuple[str, Path]] = {}
    for pyproject in DISTRIBUTIONS:
        table = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {}).get(COMMAND_GROUP, {})
        for name, target in table.items():
            assert name not in found, f"{name} is declared by {found[name][1]} and {pyproject}"
            found[name] = (target, pyproject)
    return found


def test_each_command_entry_point_names_a_module_of_its_own_layer() -> None:
    """A command's module exists and ships in the distribution that declares it: the runtime
    package names no tool's module (so the CLI, its composition root, reaches no tool)."""
    for name, (target, pyproject) in declared_commands().items():
        module, _, attribute = target.partition(":")
        assert module in MODULES and attribute == "register", f"{name} = {target!r} ({pyproject})"
        assert module.split(".")[0] in DISTRIBUTIONS[pyproject], f"{name} = {target!r} lies outside {pyproject}"


def test_the_tools_commands_are_the_tools_entry_points() -> None:
    """What the CLI says the tools add, when they are not installed, is what they declare."""
    tools = {n for n, (_, pyproject) in declared_commands().items() if pyproject.parent.name == "tools"}
    assert set(TOOL_COMMANDS) == tools


def test_each_command_maps_to_the_module_that_adds_it() -> None:
    """`boomerang X` loads only entry point X's module; that module must add X (and every
    command it adds must be an entry point of that module, or it would be missing when
    another command runs)."""
    declared = {name: target for name, (target, _) in declared_commands().items()}
    for target in set(declared.values()):
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(target.partition(":")[0]).register(sub)
        assert {n for n, t in declared.items() if t == target} == set(sub.choices), target
    assert build_parser("registry").parse_args(["registry", "--listen", "127.0.0.1:1"]).command == "registry"


def test_one_command_loads_only_its_own_module() -> None:
    """`boomerang registry` imports the registry, the library and the CLI's entry, never another
    service, another command's module or the tools (a fresh interpreter: this one has loaded
    them all)."""
    code = ("import sys; from boomerang_cli.main import build_parser; build_parser('registry'); "
            "print(' '.join(m for m in sys.modules if m.startswith('boomerang_')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    own = declared_commands()["registry"][0].partition(":")[0]
    others = {t.partition(":")[0] for t, _ in declared_commands().values()} - {own}
    assert own in loaded, done.stdout
    assert {m.split(".")[0] for m in loaded} <= {"boomerang_registry", "boomerang_server", "boomerang_cli"}, done.stdout
    assert loaded & others == set(), done.stdout
