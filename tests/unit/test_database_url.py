"""A libpq multi-host URL (an HA Postgres's nodes, the primary found by `target_session_attrs`) works
for both drivers: asyncpg reads it as it is, SQLAlchemy's asyncpg dialect gets one `host=` each."""

from __future__ import annotations

from boomerang_server.config.settings import normalize_database_url
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

MULTI = "postgresql://boomerang:pw@127.0.0.1:5433,127.0.0.1:5434/boomerang?target_session_attrs=read-write"


def test_a_multi_host_url_becomes_one_host_parameter_each() -> None:
    url = normalize_database_url(MULTI)
    assert url == ("postgresql+asyncpg://boomerang:pw@/boomerang?host=127.0.0.1:5433&host=127.0.0.1:5434"
                   "&target_session_attrs=read-write")
    parsed = make_url(url)
    assert parsed.query["host"] == ("127.0.0.1:5433", "127.0.0.1:5434")
    engine = create_async_engine(url)
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    assert kwargs["host"] == ["127.0.0.1", "127.0.0.1"] and kwargs["port"] == [5433, 5434]
    assert kwargs["target_session_attrs"] == "read-write"


def test_a_single_host_url_only_gets_its_driver() -> None:
    assert normalize_database_url("postgres://u@db:5432/b") == "postgresql+asyncpg://u@db:5432/b"
