"""Build `boomerang-vllm-hook` from ../libs: the hook package and its import closure only.

The modules are found from the source, not listed: starting from every module of
`boomerang.vllm_hook`, follow each `boomerang.*` import (with `ast`, nothing is imported) and
keep what is reached, plus the `__init__` of each package on the way. A new import in the
hook therefore ships its module without an edit here; a new third-party import fails
tests/unit/test_hook_package.py until `dependencies` in pyproject.toml names it.
"""

from __future__ import annotations

import ast
import atexit
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

LIBS = Path(__file__).resolve().parent.parent / "libs"
ROOT_PACKAGE = "boomerang.vllm_hook"


def _file(module: str) -> Path | None:
    base = LIBS.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The `boomerang.*` modules `module`'s source imports (best match for `from a import b`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if _file(f"{base}.{alias.name}") else base for alias in node.names]
        found.update(n for n in names if n.split(".")[0] == "boomerang" and _file(n))
    return found


def closure() -> set[str]:
    """Every first-party module the hook needs, its packages' `__init__`s included."""
    start = {p.relative_to(LIBS).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
             for p in (LIBS / "boomerang" / "vllm_hook").glob("*.py")}
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages' __init__s
        path = _file(module)
        assert path is not None, module
        todo += sorted(_imports(module, path) - seen)
    return seen


MODULES = closure()
PACKAGES = sorted(m for m in MODULES if (_file(m) or Path()).name == "__init__.py")


class ClosureOnly(build_py):  # type: ignore[misc]
    """build_py that copies a package's modules only when the hook's closure holds them."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        return [(pkg, mod, path) for pkg, mod, path in super().find_package_modules(package, package_dir)
                if (f"{pkg}.{mod}" if mod != "__init__" else pkg) in MODULES]


# setuptools builds in ./build and writes its egg-info beside the sources (../libs, on the
# main virtualenv's path, where it would show a second distribution); a previous build's
# folder would also still hold modules that left the closure. Build in a fresh folder instead.
WORK = Path(tempfile.mkdtemp(prefix="boomerang-vllm-hook-"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

setup(
    options={"egg_info": {"egg_base": str(WORK)}, "build": {"build_base": str(WORK / "build")}},
    packages=PACKAGES,
    package_dir={"": "../libs"},
    # The generated stubs' type information, for the modules shipped only.
    package_data={"boomerang": ["py.typed"],
                  "boomerang.v1": [m.rpartition(".")[2] + ".pyi" for m in MODULES if m.startswith("boomerang.v1.")]},
    cmdclass={"build_py": ClosureOnly},
)
