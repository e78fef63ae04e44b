"""`boomerang up`'s private PostgreSQL: made once, kept between runs, local only, stopped cleanly."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from boomerang_tools.stack.postgres import EmbeddedPostgres, PostgresError, find_binaries

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
