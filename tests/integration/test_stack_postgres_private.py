"""As root from a folder the `postgres` OS user cannot traverse (a clone under /root, any
0700 folder), the embedded cluster still starts: for the run, in a fresh folder of that
user's under the temp folder, removed at the end however the run ends (issue 26)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from boomerang_tools.stack.postgres import (
    ELSEWHERE,
    PREFIX,
    EmbeddedPostgres,
    PostgresError,
    bases,
    find_binaries,
)

from tests.support.admin_db import start_cluster
from tests.support.databases import fetch_value
from tests.support.procs import pid_gone, wait_for

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_binaries() is None, reason="no local PostgreSQL binaries"),
              pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the cluster as another OS user")]


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 0700 folder, made the current one, as a clone under /root would be."""
    folder = tmp_path / "clone"
    folder.mkdir(mode=0o700)
    monkeypatch.chdir(folder)
    yield folder


def _unreachable(path: Path) -> bool:
    probe = subprocess.run(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "test", "-x",
                            str(path)], capture_output=True, check=False)
    return probe.returncode != 0


def test_the_default_folder_in_a_private_one_runs_the_cluster_elsewhere_and_leaves_nothing(private: Path) -> None:
    root = Path(".boomerang").resolve()
    assert _unreachable(private)
    pg = EmbeddedPostgres(root)
    assert pg.movable  # the default folder: nobody chose it
    url = pg.start()
    home, pid = pg.home, pg._proc.pid if pg._proc else 0
    try:
        assert pg.temporary and home.name.startswith(PREFIX) and not home.is_relative_to(private)
        info = home.stat()
        assert (pwd.getpwuid(info.st_uid).pw_name, stat.S_IMODE(info.st_mode)) == ("postgres", 0o700)
        assert "for this run only" in pg.where and str(root) in pg.where
        assert asyncio.run(fetch_value(url, "SELECT current_user")) == "boomerang"
        # The password and the lock stay in the folder asked for, ours alone.
        assert stat.S_IMODE((root / "pg-password").stat().st_mode) == 0o600
        assert (root / ELSEWHERE).read_text().strip() == str(home)
        assert not (root / "pgdata").exists()
        # A second process on the same folder finds and joins the running cluster.
        other = EmbeddedPostgres(root)
        assert other.start() == url and not other.owner and other.home == home
        other.stop()
        assert home.exists()
    finally:
        pg.stop()
    assert pid_gone(pid)
    assert not home.exists() and not (root / ELSEWHERE).exists()
    with pytest.raises((OSError, asyncpg.PostgresError, asyncio.TimeoutError)):
        asyncio.run(fetch_value(url, "SELECT 1"))


def _run_folders() -> set[Path]:
    return {f for base in bases() for f in base.glob(PREFIX + "*")}


def test_a_folder_the_user_chose_is_not_moved(private: Path) -> None:
    before = _run_folders()
    chosen = EmbeddedPostgres(private / "db")
    assert not chosen.movable
    with pytest.raises(PostgresError, match="cannot reach .* give --data-dir"):
        chosen.start()
    chosen.stop()
    assert _run_folders() <= before and not (private / "db" / ELSEWHERE).exists()


def test_a_cluster_already_in_the_folder_is_refused_rather_than_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data made while the folder was open is someone's: a run folder would silently hide it."""
    outer = Path(tempfile.mkdtemp(prefix="boomerang-made-"))
    try:
        outer.chmod(0o755)
        folder = outer / "clone"
        folder.mkdir(mode=0o755)
        monkeypatch.chdir(folder)
        pg = EmbeddedPostgres(Path(".boomerang").resolve())
        pg.start()
        assert not pg.temporary
        pg.stop()
        folder.chmod(0o700)
        before = _run_folders()
        again = EmbeddedPostgres(Path(".boomerang").resolve())
        assert again.movable
        with pytest.raises(PostgresError, match="cannot reach"):
            again.start()
        again.stop()
        assert _run_folders() <= before
    finally:
        shutil.rmtree(outer, ignore_errors=True)


# The owner of a cluster in a run folder, killed: the postmaster (children.die_with_parent) and
# the folder (its guardian) must go with it.
CHILD = """
import json, sys, time
from pathlib import Path
from boomerang_tools.stack.postgres import EmbeddedPostgres
pg = EmbeddedPostgres(Path(".boomerang").resolve())
pg.start()
print(json.dumps({"home": str(pg.home), "pid": pg._proc.pid, "guardian": pg._run_folder.guardian.pid}), flush=True)
time.sleep(120)
"""


def test_a_killed_owner_takes_its_run_folder_along(private: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=private, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.communicate(timeout=10)[1][-3000:]
        seen = json.loads(line)
        home = Path(seen["home"])
        assert home.name.startswith(PREFIX) and home.is_dir() and not pid_gone(seen["pid"])
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        assert wait_for(lambda: pid_gone(seen["pid"]), 10), "the cluster outlived its owner"
        assert wait_for(lambda: not home.exists(), 10), f"{home} outlived its owner"
        assert wait_for(lambda: pid_gone(seen["guardian"]), 5)
        print(f"run folder removed {time.monotonic() - killed:.2f}s after SIGKILL")
    finally:
        child.kill()
        child.communicate(timeout=10)


def test_the_tests_private_cluster_starts_from_a_private_temp_folder(private: Path) -> None:
    """`make test` without a server on 5432 and TMPDIR under /root."""
    cluster = start_cluster(private)
    home = cluster.pg.home
    try:
        assert cluster.pg.temporary and home.name.startswith(PREFIX)
        assert asyncio.run(fetch_value(cluster.admin_url, "SELECT 1")) == "1"
    finally:
        cluster.close()
    assert not home.exists() and not cluster.folder.exists()
