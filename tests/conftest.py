"""Shared fixtures: a fresh Postgres database per test session, migrated once.

Tests use the real Postgres (BOOMERANG_TEST_ADMIN_URL, default the local server with trust
auth); when nothing answers there, a private embedded cluster (tests/support/admin_db.py,
pip's PostgreSQL on a machine without one). Each session creates `boomerang_test_<random>`
and drops it at the end; tests keep out of each other's way with unique tenants and
conversation ids instead of truncating (the audit table refuses TRUNCATE by design).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from tests.support.admin_db import DEFAULT_ADMIN_URL, choose_admin_url
from tests.support.databases import fresh_database

ADMIN_URL, _EMBEDDED, POSTGRES_NOTE = choose_admin_url(os.environ.get("BOOMERANG_TEST_ADMIN_URL", DEFAULT_ADMIN_URL))
if _EMBEDDED is not None:
    # tests/support/databases.py reads it, and so do the processes tests start.
    os.environ["BOOMERANG_TEST_ADMIN_URL"] = ADMIN_URL
# The routers tests start plan from the configured costs: their simulated engines run at time
# scale 0 (or nearly), so the times turns report are HTTP noise, and a router that learned
# from them would plan by noise. Tests of the learning set it themselves.
os.environ.setdefault("BOOMERANG_TTFT_LEARNING_TURNS", "0")
# The tests' prompts are tens to hundreds of tokens. Over the default prefill floor (one forward
# pass of Qwen3-32B on an H200, about 50 ms) recomputing them costs what a pull does, so the
# router would rightly not pull them; the tests' engines are no such model, and have no floor.
os.environ.setdefault("BOOMERANG_TTFT_PREFILL_FLOOR_MS", "0")


def pytest_report_header() -> str:
    """Which Postgres this run uses."""
    return f"postgres: {POSTGRES_NOTE}"


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A migrated, empty database for this test session."""
    if POSTGRES_NOTE.startswith("nothing answers"):
        pytest.fail(POSTGRES_NOTE)
    with fresh_database("boomerang_test") as url:
        yield url


@pytest.fixture
def unique() -> str:
    """A short unique suffix for tenants, conversations and engine ids."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def pg(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A raw asyncpg connection to the test database, for assertions."""
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()
