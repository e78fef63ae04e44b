"""What the image holds, read from the Dockerfile without a Docker engine: the runtime package
and the runtime pins, never the tools (boomerang-tools) or their dependencies (matplotlib).

The wheel is built here from exactly the paths the Dockerfile's build stage copies, as its
`pip wheel` builds it; the locks are checked against the installed distributions' metadata.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
TOOLS_ONLY = {"matplotlib", "boomerang-tools"}
# Boomerang's own distributions: built from this tree, never pinned in a lock.
FIRST_PARTY = {"boomerang", "boomerang-client", "boomerang-tools"}


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), stage by stage."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            out.append([])
        elif line and not line.startswith("#") and out:
            out[-1].append(line)
    return out


def copies(stage: list[str]) -> dict[str, str]:
    """A stage's `COPY` from the build context: destination by source (`--from=` copies aside)."""
    found = {}
    for line in stage:
        words = shlex.split(line)
        if words[0] == "COPY" and not any(w.startswith("--from=") for w in words):
            *sources, dest = words[1:]
            found.update({source: dest for source in sources})
    return found


def lock(name: str) -> dict[str, str]:
    """A lock's pins: canonical name -> version."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith("#"):
            project, version = line.split("==")
            pins[canonicalize_name(project)] = version
    return pins


def closure(requirements: list[str]) -> set[str]:
    """Every distribution `requirements` need (extras followed), from the installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for spec in distribution(req.name).requires or []:
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(dep)
    return {name for name, _ in seen}


def project(pyproject: Path) -> dict:  # type: ignore[type-arg]
    return tomllib.loads(pyproject.read_text())["project"]  # type: ignore[no-any-return]


def test_the_build_stage_copies_no_tools() -> None:
    build, _ = stages()
    sources = copies(build)
    assert {"client", "libs", "services"} <= set(sources)
    assert not any(s == "tools" or s.startswith("tools/") or s in {".", "./"} for s in sources), sources
    assert "tools" in (ROOT / ".dockerignore").read_text().split()


def test_the_image_installs_the_runtime_lock_alone() -> None:
    _, final = stages()
    locks = {Path(source).name for source in copies(final) if source.startswith("requirements")}
    assert locks == {"requirements.lock"}


def test_the_runtime_lock_is_exactly_what_the_package_needs() -> None:
    """requirements.lock pins the closure of pyproject.toml's dependencies: nothing the tools or
    the tests alone need (matplotlib, pytest), nothing missing."""
    runtime = closure(project(ROOT / "pyproject.toml")["dependencies"]) - FIRST_PARTY
    assert set(lock("requirements.lock")) == runtime
    assert not TOOLS_ONLY & runtime


def test_the_tools_lock_holds_what_the_tools_add() -> None:
    try:
        distribution("boomerang-tools")
    except PackageNotFoundError:
        pytest.fail("boomerang-tools is not installed: run `make setup`")
    runtime = set(lock("requirements.lock"))
    added = closure(project(ROOT / "tools" / "pyproject.toml")["dependencies"]) - runtime - FIRST_PARTY
    assert set(lock("requirements-tools.lock")) == added
    assert "matplotlib" in added


def test_no_pin_is_in_two_locks() -> None:
    names = [set(lock(n)) for n in ("requirements.lock", "requirements-tools.lock", "requirements-dev.lock")]
    assert all(not a & b for i, a in enumerate(names) for b in names[i + 1 :])


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the Dockerfile's `pip wheel` builds, from a context of only what it copies."""
    build, _ = stages()
    context = tmp_path_factory.mktemp("image-context")
    for source, dest in copies(build).items():
        target = context / (Path(source).name if dest.endswith("/") else dest)
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            shutil.copy(ROOT / source, target)
    out = tmp_path_factory.mktemp("image-wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", str(context), "-w", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("boomerang-*.whl")
    return wheel


def test_the_image_wheel_holds_no_tool(image_wheel: Path) -> None:
    with zipfile.ZipFile(image_wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(z.read(info).decode())
        entry_points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "boomerang_cli/main.py" in names and "boomerang_registry/cli.py" in names
    assert not [n for n in names if n.startswith("boomerang_tools")]
    requires = {canonicalize_name(Requirement(r).name) for r in metadata.get_all("Requires-Dist") or []}
    assert not requires & TOOLS_ONLY
    assert "boomerang_tools" not in entry_points and "registry = boomerang_registry.cli:register" in entry_points
