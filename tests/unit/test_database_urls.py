"""Database URLs: one setting, read by SQLAlchemy and by plain asyncpg alike, several hosts included."""

from __future__ import annotations

import pytest
from boomerang_server.config import asyncpg_dsn, normalize_database_url
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

MULTI = "postgresql://svc:pw@pg-a:5432,pg-b:5433/boomerang?target_session_attrs=read-write"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@127.0.0.1:5432/b", "postgresql+asyncpg://u@127.0.0.1:5432/b"),
        ("postgres://u@h/b?sslmode=require", "postgresql+asyncpg://u@h/b?sslmode=require"),
        (MULTI, "postgresql+asyncpg://svc:pw@/boomerang?host=pg-a:5432&host=pg-b:5433&target_session_attrs=read-write"),
        ("postgresql://pg-a:1,pg-b:2/b", "postgresql+asyncpg:///b?host=pg-a:1&host=pg-b:2"),
    ],
)
def test_sqlalchemy_reads_several_hosts_as_host_parameters(url: str, expected: str) -> None:
    assert normalize_database_url(url) == expected
    assert normalize_database_url(expected) == expected  # normalizing twice changes nothing


@pytest.mark.parametrize("url", [MULTI, normalize_database_url(MULTI)])
def test_asyncpg_gets_every_host_in_the_libpq_form(url: str) -> None:
    # asyncpg keeps only the last of repeated `host` parameters: a failover would find no primary.
    assert asyncpg_dsn(url) == "postgresql://svc:pw@pg-a:5432,pg-b:5433/boomerang?target_session_attrs=read-write"


def test_one_host_is_left_as_it_is() -> None:
    assert asyncpg_dsn("postgresql://u@h:5432/b?x=1") == "postgresql://u@h:5432/b?x=1"
    assert asyncpg_dsn("postgresql://u@/b?host=h:5432") == "postgresql://u@/b?host=h:5432"


def test_other_schemes_are_refused() -> None:
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        normalize_database_url("mysql://u@h/b")


HA_URL = "postgresql://boomerang:pw@127.0.0.1:5433,127.0.0.1:5434/boomerang?target_session_attrs=read-write"


def test_a_multi_host_url_becomes_one_host_parameter_each() -> None:
    url = normalize_database_url(HA_URL)
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
