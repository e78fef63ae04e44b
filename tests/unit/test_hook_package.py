"""`boomerang-vllm-hook` (hook/) and `boomerang-client` (client/): the vLLM hook as a distribution
of its own, under its own import name, over the one small distribution it shares with the services.

Built here exactly as `make hook-wheel` builds them. The hook's wheel holds `boomerang_vllm_hook`
only, the client's `boomerang` only, and no module is in two distributions (so installing or
uninstalling one never touches another's files); each declares exactly the distributions its
modules import; unpacked alone, the two import and build the hook with no other third-party
package reachable; and the hook also builds from an sdist.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.hook_wheel import build_hook_wheels
from tests.unit.test_imports import DISTRIBUTIONS

ROOT = Path(__file__).resolve().parents[2]
# vLLM is the host the connector runs in, not a dependency to install into it.
HOST = {"vllm"}
# First-party import names and the distribution that ships each.
FIRST_PARTY = {"boomerang": "boomerang-client", "boomerang_vllm_hook": "boomerang-vllm-hook"}
# Third-party imports inside functions that the hook never reaches: each with the function
# that leads to it, which no shipped module but its own may name (test_unreached_stays_so).
UNREACHED = {
    # boomerang.telemetry and boomerang.grpcutil load OpenTelemetry once tracing is set up.
    "opentelemetry": ("boomerang.telemetry", "setup_tracing"),
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_hook_wheels(tmp_path_factory.mktemp("hook-wheel"))


@pytest.fixture(scope="module")
def unpacked(wheels: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hook-unpacked")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
    return out


def shipped_modules(unpacked: Path, top: str) -> dict[str, Path]:
    out = {}
    for path in (unpacked / top).rglob("*.py"):
        rel = path.relative_to(unpacked).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def third_party_imports(modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """Top-level names of non-stdlib imports: (at module level, in functions)."""
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
                if name.split(".")[0] in sys.stdlib_module_names:
                    continue
                (deferred if id(node) in in_functions else top).add(name)
    return top, deferred


def distribution_of(module: str) -> str:
    """The distribution that ships `module`: first-party by name; else the installed one whose
    files hold it (namespace packages like `google` are shared, so this goes by file)."""
    if module.split(".")[0] in FIRST_PARTY:
        return FIRST_PARTY[module.split(".")[0]]
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


def tops(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[0] for n in z.namelist() if ".dist-info/" not in n}


def test_each_wheel_holds_its_own_import_name_only(wheels: tuple[Path, Path], unpacked: Path) -> None:
    client, hook = wheels
    assert tops(client) == {"boomerang"}
    assert tops(hook) == {"boomerang_vllm_hook"}
    # The client is the wire and the client side: nothing of the services' halves.
    assert not (unpacked / "boomerang_server").exists()
    assert "boomerang.v1.registry_service_pb2" in shipped_modules(unpacked, "boomerang")
    assert "boomerang.clients.sync" in shipped_modules(unpacked, "boomerang")


def test_no_import_name_is_in_two_distributions() -> None:
    owners: dict[str, list[str]] = {}
    for pyproject, names in DISTRIBUTIONS.items():
        dist = tomllib.loads(pyproject.read_text())["project"]["name"]
        for name in names:
            owners.setdefault(name, []).append(dist)
    assert {name: dists for name, dists in owners.items() if len(dists) > 1} == {}


@pytest.mark.parametrize("which", [0, 1], ids=["client", "hook"])
def test_declared_dependencies_are_exactly_what_the_modules_import(
    wheels: tuple[Path, Path], unpacked: Path, which: int
) -> None:
    wheel = wheels[which]
    (own,) = tops(wheel)
    top, deferred = third_party_imports(shipped_modules(unpacked, own))
    needed = {distribution_of(name) for name in top if name.split(".")[0] not in HOST | {own}}
    assert declared(wheel) == needed, f"{own}'s pyproject.toml dependencies must list exactly these"
    assert {name.split(".")[0] for name in deferred} - HOST - {own} <= UNREACHED.keys()


def test_unreached_stays_so(unpacked: Path) -> None:
    shipped = shipped_modules(unpacked, "boomerang") | shipped_modules(unpacked, "boomerang_vllm_hook")
    callers = [(m, entry) for owner, entry in UNREACHED.values() for m, path in shipped.items()
               if m != owner and entry in path.read_text()]
    assert callers == []


def test_the_hook_builds_from_its_sdist(tmp_path: Path) -> None:
    """An sdist of hook/ holds everything a wheel needs: build one from a copy (nothing is written
    into the source tree), then a wheel from the unpacked sdist alone."""
    src = tmp_path / "hook"
    shutil.copytree(ROOT / "hook", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    build = ("import sys; from setuptools import build_meta as b; "
             "print(getattr(b, sys.argv[1])(sys.argv[2]))")
    sdist = subprocess.run([sys.executable, "-c", build, "build_sdist", str(tmp_path)], cwd=src,
                           capture_output=True, text=True, timeout=120)
    assert sdist.returncode == 0, sdist.stderr[-2000:]
    name = sdist.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as t:
        t.extractall(tmp_path / "unpacked", filter="data")
    (root,) = (tmp_path / "unpacked").iterdir()
    wheel = subprocess.run([sys.executable, "-c", build, "build_wheel", str(tmp_path / "wheel")], cwd=root,
                           capture_output=True, text=True, timeout=120)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "wheel" / wheel.stdout.strip().splitlines()[-1]) as z:
        names = z.namelist()
    assert "boomerang_vllm_hook/connector.py" in names and "boomerang_vllm_hook/py.typed" in names


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
        if top in sys.stdlib_module_names or top in allowed or top.startswith("_sysconfigdata"):
            return None
        raise ModuleNotFoundError(f"{name} is outside boomerang-vllm-hook's dependencies", name=name)

sys.meta_path.insert(0, Only())
sys.path.insert(0, wheel_dir)
import boomerang_vllm_hook.connector as connector
from boomerang_vllm_hook.config import parse_config
from boomerang_vllm_hook.hook import BoomerangHook
from boomerang_vllm_hook.sender import EngineFacts

config = parse_config({"boomerang": {"role": "prefill", "router": "127.0.0.1:9", "registry": "127.0.0.1:9",
                                     "tenant": "acme"}})
hook = BoomerangHook(config, EngineFacts("p-1", "prefill", "m", 16, 480, 64))
hook.close(timeout=1.0)
outside = sorted(m for m, mod in list(sys.modules.items())
                 if m.split(".")[0] in ("boomerang", "boomerang_vllm_hook") and not (getattr(mod, "__file__", None) or wheel_dir).startswith(wheel_dir))
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


def test_the_wheels_alone_import_and_build_the_hook(wheels: tuple[Path, Path], unpacked: Path) -> None:
    allowed = importable_names((declared(wheels[0]) | declared(wheels[1])) - set(FIRST_PARTY.values()))
    allowed |= set(FIRST_PARTY)
    done = subprocess.run([sys.executable, "-I", "-c", ALONE, str(unpacked), json.dumps(sorted(allowed))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"vllm": False, "outside": []}
