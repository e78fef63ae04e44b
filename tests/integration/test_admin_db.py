"""Which Postgres `make test` uses: the configured server when it answers, else a private
embedded cluster, stopped and removed when the test process ends, however it ends."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import ADMIN_URL
from tests.support.admin_db import PREFIX, answers, choose_admin_url, sweep
from tests.support.procs import pid_gone, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# What a test process does with the fixture selection: import the suite's conftest (as
# pytest does), use its admin URL for real, report, then exit or wait to be killed.
CHILD = """
import asyncio, json, os, sys, time
import asyncpg
import tests.conftest as c

async def use():
    conn = await asyncpg.connect(c.ADMIN_URL.replace("postgresql+asyncpg://", "postgresql://"), timeout=10)
    try:
        await conn.execute('CREATE DATABASE "selection_probe"')
        return await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname = 'selection_probe'")
    finally:
        await conn.close()

pg = c._EMBEDDED.pg if c._EMBEDDED else None
print(json.dumps({"url": c.ADMIN_URL, "env": os.environ["BOOMERANG_TEST_ADMIN_URL"], "note": c.POSTGRES_NOTE,
                  "probe": asyncio.run(use()), "pid": pg._proc.pid if pg else 0,
                  "folder": str(c._EMBEDDED.folder) if c._EMBEDDED else ""}), flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
"""


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"  # nothing listens there once closed


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A temp folder of its own that the `postgres` OS user can traverse."""
    path = Path(tempfile.mkdtemp(prefix="boomerang-sel-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _child(mode: str, admin_url: str, tmpdir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "BOOMERANG_TEST_ADMIN_URL": admin_url, "TMPDIR": str(tmpdir)}
    return subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_server_that_answers_is_used_as_it_is() -> None:
    assert answers(ADMIN_URL)
    url, cluster, note = choose_admin_url(ADMIN_URL)
    assert (url, cluster) == (ADMIN_URL, None)
    assert "BOOMERANG_TEST_ADMIN_URL" in note


def test_nothing_answering_means_an_embedded_cluster_stopped_and_removed_at_exit(open_dir: Path) -> None:
    dead = _dead_url()
    assert not answers(dead)
    child = _child("exit", dead, open_dir)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    seen = json.loads(out.splitlines()[-1])
    assert seen["url"] != dead and seen["env"] == seen["url"] and seen["probe"] == 1
    assert seen["note"].startswith("embedded cluster"), seen["note"]
    assert Path(seen["folder"]).parent == open_dir and seen["folder"].startswith(str(open_dir / PREFIX))
    # Stopped and removed by the time the test process has exited.
    assert pid_gone(seen["pid"])
    assert not Path(seen["folder"]).exists()
    with pytest.raises((OSError, asyncpg.PostgresError, asyncio.TimeoutError)):
        asyncio.run(asyncpg.connect(seen["url"], timeout=3))


def test_a_killed_test_process_takes_its_cluster_along(open_dir: Path) -> None:
    child = _child("wait", _dead_url(), open_dir)
    try:
        assert child.stdout is not None
        seen = json.loads(child.stdout.readline())
        assert not pid_gone(seen["pid"]) and answers(seen["url"])
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # The kernel tells the postmaster its parent died: fast shutdown.
        assert wait_for(lambda: pid_gone(seen["pid"]), 10), "the cluster outlived its test process"
        assert not answers(seen["url"])
        # Its folder stays until a later run sweeps it (its lock is free now).
        assert Path(seen["folder"]).exists()
        assert sweep(open_dir, older_than=0) == [Path(seen["folder"])]
        assert not Path(seen["folder"]).exists()
    finally:
        child.kill()
        child.communicate(timeout=10)  # reaps it and closes its pipes
