"""The stack's children run the `boomerang` script Boomerang's installation wrote, found from
the installation's own record (not a module started by name, not a guess beside the
interpreter)."""

from __future__ import annotations

import subprocess
from importlib.metadata import PathDistribution, distributions
from pathlib import Path

import pytest
from boomerang_tools.stack import children
from boomerang_tools.stack.children import ChildFailed, boomerang_script, recorded_script


def _dist_info(where: Path, record: str) -> PathDistribution:
    info = where / "boomerang-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boomerang\nVersion: 0.1.0\n")
    (info / "RECORD").write_text(record)
    return PathDistribution(info)


def test_the_script_is_the_one_the_installation_recorded_and_runs_the_commands() -> None:
    script = boomerang_script()
    assert script in {recorded_script(d) for d in distributions(name="boomerang")}
    done = subprocess.run([str(script), "registry", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: boomerang registry"), done.stderr


def test_a_recorded_script_is_found_where_the_record_says_and_only_if_it_is_there(tmp_path: Path) -> None:
    dist = _dist_info(tmp_path / "lib", "../bin/boomerang,,\n")
    assert recorded_script(dist) is None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "boomerang").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "boomerang").chmod(0o755)
    assert recorded_script(dist) == (tmp_path / "bin" / "boomerang").resolve()


def test_an_installation_without_the_script_fails_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = _dist_info(tmp_path, "boomerang_cli/main.py,,\n")
    monkeypatch.setattr(children, "distributions", lambda name: [bare])
    with pytest.raises(ChildFailed, match=r"without its `boomerang` script; reinstall it"):
        boomerang_script.__wrapped__()
