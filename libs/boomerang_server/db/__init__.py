"""The database: the async SQLAlchemy engine every service uses (asyncpg underneath), the
Alembic migrations (`boomerang migrate`, and every service at start-up) and the splitting of
their SQL scripts into statements (asyncpg prepares one statement at a time)."""

from __future__ import annotations

from pathlib import Path

from alembic import command, op
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from boomerang_server.config import normalize_database_url

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(
    url: str, pool_size: int = 10, application_name: str = "boomerang", role: str = ""
) -> AsyncEngine:
    """An engine with a warm-able pool, short connect timeout and READ COMMITTED.

    With `role`, every connection runs as that Postgres role (row-level security applies).
    """
    server_settings = {"application_name": application_name}
    if role:
        server_settings["role"] = role
    return create_async_engine(
        normalize_database_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={
            "timeout": 5,
            "command_timeout": 10,
            "server_settings": server_settings,
        },
    )


async def warm_pool(engine: AsyncEngine, connections: int) -> None:
    """Open `connections` pooled connections now so the first calls do not pay for them."""
    held = []
    try:
        for _ in range(connections):
            held.append(await engine.connect())
    finally:
        for conn in held:
            await conn.close()


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at Boomerang's migrations and `url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalize_database_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "heads") -> None:
    """Migrate the database at `url` to `revision` (safe to run from several processes)."""
    command.upgrade(alembic_config(url), revision)


def split_statements(script: str) -> list[str]:
    """Statements of `script`, split on `;` outside quotes, `$$` bodies and `--` comments."""
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(script)
    in_dollar = in_quote = in_comment = False
    while i < n:
        ch = script[i]
        if in_comment:
            if ch == "\n":
                in_comment = False
            i += 1
            continue
        if not in_dollar and not in_quote and script.startswith("--", i):
            in_comment = True
            i += 2
            continue
        if not in_quote and script.startswith("$$", i):
            in_dollar = not in_dollar
            current.append("$$")
            i += 2
            continue
        if not in_dollar and ch == "'":
            in_quote = not in_quote
        if ch == ";" and not in_dollar and not in_quote:
            stmt = "".join(current).strip()
            if stmt:
                statements.append(stmt)
            current = []
        else:
            current.append(ch)
        i += 1
    tail = "".join(current).strip()
    if tail:
        statements.append(tail)
    return statements


def run_script(script: str) -> None:
    """Run a migration's SQL script (`upgrade()`, `downgrade()`), one statement at a time."""
    for statement in split_statements(script):
        op.execute(statement)
