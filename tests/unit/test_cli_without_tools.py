"""`boomerang` where only the runtime package is installed (the image): a tools command answers
with one line saying how to get the tools.

The interpreter runs without site-packages (`-S`); its path holds Boomerang's sources and a
copy of the installed `boomerang` distribution's metadata alone, so the entry points it sees
are the runtime package's, as in the image.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest
from boomerang_cli.main import TOOL_COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "libs", ROOT / "services" / "cli"]


def runtime_only(tmp_path: Path) -> Path:
    """A folder holding the installed boomerang distribution's metadata (entry points included)."""
    info = next(Path(str(d._path)) for d in distributions(name="boomerang")  # type: ignore[attr-defined]
                if Path(str(d._path)).suffix == ".dist-info")  # type: ignore[attr-defined]
    shutil.copytree(info, tmp_path / info.name)
    return tmp_path


def run(argv: list[str], path: list[Path]) -> subprocess.CompletedProcess[str]:
    code = ("import sys; sys.path[:0] = sys.argv[1].split(':'); from boomerang_cli.main import main; "
            "sys.exit(main(sys.argv[2:]))")
    return subprocess.run([sys.executable, "-S", "-c", code, ":".join(map(str, path)), *argv],
                          capture_output=True, text=True, timeout=120, cwd=path[0])


@pytest.mark.parametrize("command", ["demo", "up"])
def test_a_tools_command_says_how_to_get_the_tools(tmp_path: Path, command: str) -> None:
    done = run([command, "--quick"], [runtime_only(tmp_path), *SOURCES])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"boomerang {command}: the tools ({', '.join(TOOL_COMMANDS)}) are not installed")
    assert "pip install ./tools" in done.stderr


def test_with_the_tools_installed_the_command_is_theirs() -> None:
    done = subprocess.run([sys.executable, "-c", "from boomerang_cli.main import commands; print(commands()['demo'].value)"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "boomerang_tools.demo.cli:register", done.stderr
