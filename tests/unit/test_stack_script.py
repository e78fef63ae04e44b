"""The stack's children run the `boomerang` script Boomerang's installation wrote, found from
the installation's own record (not a module started by name, not a guess beside the
interpreter)."""

from __future__ import annotations

import subprocess
from importlib.metadata import PathDistribution, distribution
from pathlib import Path

import pytest
from boomerang_tools.stack.children import ChildFailed, boomerang_script, installed_script


def test_the_script_is_the_one_the_installation_recorded_and_runs_the_commands() -> None:
    script = boomerang_script()
    recorded = [f for f in distribution("boomerang").files or () if f.name == "boomerang"]
    assert [Path(str(distribution("boomerang").locate_file(f))).resolve() for f in recorded] == [script]
    done = subprocess.run([str(script), "registry", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: boomerang registry"), done.stderr


def test_an_installation_without_the_script_fails_with_the_fix(tmp_path: Path) -> None:
    info = tmp_path / "boomerang-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boomerang\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("boomerang_cli/main.py,,\nboomerang-0.1.0.dist-info/RECORD,,\n")
    with pytest.raises(ChildFailed, match=r"without its `boomerang` script; reinstall it"):
        installed_script(PathDistribution(info))


def test_a_recorded_script_that_is_gone_is_not_run(tmp_path: Path) -> None:
    info = tmp_path / "lib" / "boomerang-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boomerang\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("../bin/boomerang,,\n")
    with pytest.raises(ChildFailed):
        installed_script(PathDistribution(info))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "boomerang").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "boomerang").chmod(0o755)
    assert installed_script(PathDistribution(info)) == (tmp_path / "bin" / "boomerang").resolve()
