"""Tenants and API keys on the real Postgres: only the hash is stored; keys resolve to their tenant."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from boomerang_gateway import tenants
from boomerang_gateway.tenants import TenantAuth, TenantExists, TenantStore
from boomerang_server.db import make_engine
from sqlalchemy.ext.asyncio import AsyncEngine

pytestmark = pytest.mark.integration
BOOMERANG = str(Path(sys.executable).with_name("boomerang"))


@pytest.fixture(scope="module")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(database_url, pool_size=2)
    yield eng
    await eng.dispose()


async def test_create_resolve_and_list(engine: AsyncEngine, pg: asyncpg.Connection, unique: str) -> None:
    store = TenantStore(engine)
    name = f"acme-{unique}"
    key = await store.create(name)
    assert await store.resolve(key) == name
    row = await pg.fetchrow("SELECT * FROM tenants WHERE name = $1", name)
    assert row["key_hash"] == tenants.hash_key(key) and key not in str(dict(row))
    assert row["key_id"] == tenants.key_id_of(key)
    listed = {t.name: t for t in await store.list()}
    assert listed[name].key_id == row["key_id"] and not listed[name].disabled
    with pytest.raises(TenantExists):
        await store.create(name)
    with pytest.raises(ValueError):
        await store.create("anonymous")


async def test_wrong_unknown_and_disabled_keys_resolve_to_nobody(
    engine: AsyncEngine, pg: asyncpg.Connection, unique: str
) -> None:
    store = TenantStore(engine)
    key = await store.create(f"t-{unique}")
    key_id = tenants.key_id_of(key)
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")  # right key id, wrong secret
    assert await store.resolve(forged) is None
    assert await store.resolve(tenants.new_key().key) is None
    assert await store.resolve("EMPTY") is None
    await pg.execute("UPDATE tenants SET disabled_at = now() WHERE key_id = $1", key_id)
    assert await store.resolve(key) is None


async def test_auth_caches_verified_keys_only(engine: AsyncEngine, pg: asyncpg.Connection, unique: str) -> None:
    store = TenantStore(engine)
    key = await store.create(f"c-{unique}")
    auth = TenantAuth(store, allow_anonymous=False, cache_seconds=60)
    assert await auth.tenant_for(f"Bearer {key}") == f"c-{unique}"
    await pg.execute("DELETE FROM tenants WHERE name = $1", f"c-{unique}")
    assert await auth.tenant_for(f"bearer {key}") == f"c-{unique}"  # cached for key_cache_seconds
    assert await TenantAuth(store, False, 0).tenant_for(f"Bearer {key}") is None
    assert await auth.tenant_for("Bearer " + tenants.new_key().key) is None


def test_cli_prints_the_key_once_and_lists_without_it(database_url: str, unique: str) -> None:
    env = {"BOOMERANG_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}
    made = subprocess.run([BOOMERANG, "tenants", "create", f"cli-{unique}"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert tenants.key_id_of(key) is not None and "shown only now" in made.stderr
    again = subprocess.run([BOOMERANG, "tenants", "create", f"cli-{unique}"], capture_output=True, text=True, env=env,
                           timeout=60)
    assert again.returncode == 1 and "already exists" in again.stderr
    listed = subprocess.run([BOOMERANG, "tenants", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0 and f"cli-{unique}" in listed.stdout and key not in listed.stdout
