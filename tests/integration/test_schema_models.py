"""The SQLAlchemy tables the services write through (`boomerang_server.db.models`) are what the
migrations create: the same columns, each of the same type and nullability. The migrations
are the schema's truth; a column added to one and not the other fails here."""

from __future__ import annotations

import asyncpg
import pytest
from boomerang_server.db.models import metadata
from sqlalchemy.dialects import postgresql

pytestmark = pytest.mark.integration

COLUMNS_SQL = """
SELECT column_name, data_type, is_nullable = 'YES' AS nullable
FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1
"""


async def test_each_model_table_matches_the_migrated_schema(pg: asyncpg.Connection) -> None:
    assert {t.name for t in metadata.sorted_tables} == {"turn_plans", "tenants"}
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    for table in metadata.sorted_tables:
        migrated = {r["column_name"]: (r["data_type"], r["nullable"]) for r in await pg.fetch(COLUMNS_SQL, table.name)}
        modelled = {c.name: (c.type.compile(dialect=dialect).lower(), bool(c.nullable)) for c in table.columns}
        assert modelled == migrated, table.name
