"""Apply the Alembic migrations (`boomerang migrate`, and every service at start-up)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from boomerang.config.settings import sqlalchemy_database_url

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at Boomerang's migrations and `url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_database_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "heads") -> None:
    """Migrate the database at `url` to `revision` (safe to run from several processes)."""
    command.upgrade(alembic_config(url), revision)
