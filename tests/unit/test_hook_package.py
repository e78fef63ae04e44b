"""`boomerang-vllm-hook` (hook/): the vLLM hook as a distribution of its own.

Built here exactly as `make hook-wheel` builds it. The wheel must hold the hook and the library
modules it imports and nothing else (no service, tool, database or server code); its declared
dependencies must be exactly the distributions those modules import; and, unpacked alone, it
must import and build the hook with no other third-party package reachable.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.hook_wheel import build_hook_wheel
from tests.unit.test_imports import MODULES, graph

ROOT = Path(__file__).resolve().parents[2]
# vLLM is the host the connector runs in, not a dependency to install into it.
HOST = {"vllm"}
# Third-party imports inside functions that the hook never reaches: each with the function
# that leads to it, which no shipped module but its own may name (test_unreached_stays_so).
UNREACHED = {
    # boomerang.telemetry and grpcutil.channel load OpenTelemetry once tracing is set up.
    "opentelemetry": ("boomerang.telemetry", "setup_tracing"),
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hook_wheel(tmp_path_factory.mktemp("hook-wheel"))


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hook-unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


def shipped_modules(unpacked: Path) -> dict[str, Path]:
    out = {}
    for path in (unpacked / "boomerang").rglob("*.py"):
        rel = path.relative_to(unpacked).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def hook_closure() -> set[str]:
    """The hook's modules and every first-party module they import, transitively (the
    generated stubs aside: test_imports does not scan them)."""
    edges = graph()
    todo = [m for m in MODULES if m.startswith("boomerang.vllm_hook")]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            parts = m.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(edges[m])
    return seen


def third_party_imports(modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """Top-level names of non-first-party, non-stdlib imports: (at module level, in functions)."""
    top: set[str] = set()
    deferred: set[str] = set()
    for path in modules.values():
        tree = ast.parse(path.read_text())
        in_functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for n in ast.walk(f)}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module
                     else [])
            for name in names:
                if name.split(".")[0] in sys.stdlib_module_names or name.split(".")[0] == "boomerang":
                    continue
                (deferred if id(node) in in_functions else top).add(name)
    return top, deferred


def distribution_of(module: str) -> str:
    """The installed distribution whose files hold `module` (namespace packages like `google`
    are shared, so this goes by file, not by top-level name)."""
    rel = module.replace(".", "/")
    for dist in metadata.distributions():
        for f in dist.files or ():
            if str(f) in (f"{rel}.py", f"{rel}/__init__.py") or str(f).startswith(f"{rel}/"):
                return canonicalize_name(dist.metadata["Name"])
    raise AssertionError(f"no installed distribution holds {module}")


def declared(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return {canonicalize_name(Requirement(r).name) for r in Parser().parsestr(meta).get_all("Requires-Dist") or []}


def test_the_wheel_holds_the_hook_and_what_it_imports_only(wheel: Path, unpacked: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert tops == {"boomerang", "boomerang_vllm_hook-0.1.0.dist-info"}
    shipped = shipped_modules(unpacked)
    assert {m for m in shipped if not m.startswith("boomerang.v1")} == hook_closure()
    # Not the services' halves of the library: no database, server (nor its side of errors),
    # settings or metrics.
    for absent in ("boomerang.db", "boomerang.grpcutil.server", "boomerang.grpcutil.status",
                   "boomerang.config", "boomerang.metrics"):
        assert not any(m == absent or m.startswith(absent + ".") for m in shipped), absent
    assert not list(unpacked.rglob("README.md"))


def test_declared_dependencies_are_exactly_what_the_modules_import(wheel: Path, unpacked: Path) -> None:
    top, deferred = third_party_imports(shipped_modules(unpacked))
    needed = {distribution_of(name) for name in top if name.split(".")[0] not in HOST}
    assert declared(wheel) == needed, "hook/pyproject.toml's dependencies must list exactly these"
    assert {name.split(".")[0] for name in deferred} - HOST <= UNREACHED.keys()


def test_unreached_stays_so(unpacked: Path) -> None:
    callers = [(m, entry) for owner, entry in UNREACHED.values() for m, path in shipped_modules(unpacked).items()
               if m != owner and entry in path.read_text()]
    assert callers == []


# Run in a fresh interpreter: only the unpacked wheel, the standard library and the declared
# distributions (with what they require) can be imported; anything else raises
# ModuleNotFoundError, as it would in an environment holding only this package and its deps.
ALONE = r"""
import importlib.abc, json, sys
from importlib import metadata
wheel_dir, allowed = sys.argv[1], set(json.loads(sys.argv[2]))

class Only(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in allowed or top == "boomerang" or top.startswith("_sysconfigdata"):
            return None
        raise ModuleNotFoundError(f"{name} is outside boomerang-vllm-hook's dependencies", name=name)

sys.meta_path.insert(0, Only())
sys.path.insert(0, wheel_dir)
import boomerang.vllm_hook.connector as connector
from boomerang.vllm_hook.config import parse_config
from boomerang.vllm_hook.hook import BoomerangHook
from boomerang.vllm_hook.presence import EngineFacts

config = parse_config({"boomerang": {"role": "prefill", "router": "127.0.0.1:9", "registry": "127.0.0.1:9",
                                     "tenant": "acme"}})
hook = BoomerangHook(config, EngineFacts("p-1", "prefill", "m", 16, 480, 64))
hook.close(timeout=1.0)
outside = sorted(m for m, mod in list(sys.modules.items())
                 if m.split(".")[0] == "boomerang" and not (getattr(mod, "__file__", None) or wheel_dir).startswith(wheel_dir))
print(json.dumps({"vllm": connector.VLLM_AVAILABLE, "outside": outside}))
"""


def importable_names(dists: set[str]) -> set[str]:
    """Top-level import names of `dists` and, transitively, of what they require."""
    names: set[str] = set()
    todo, seen = list(dists), set()
    by_top = metadata.packages_distributions()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        names |= {top for top, owners in by_top.items() if name in {canonicalize_name(o) for o in owners}}
        for req in metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return names


def test_the_wheel_alone_imports_and_builds_the_hook(wheel: Path, unpacked: Path) -> None:
    allowed = importable_names(declared(wheel))
    done = subprocess.run([sys.executable, "-I", "-c", ALONE, str(unpacked), json.dumps(sorted(allowed))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"vllm": False, "outside": []}
