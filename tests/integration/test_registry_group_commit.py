"""Group commit: registrations share transactions, each acknowledged only after commit."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from boomerang.errors import BoomerangError
from boomerang_registry import wire
from boomerang_registry.group_commit import RegistrationBatcher

from tests.support.registry_data import blocks_request, engine_request
from tests.support.registry_repo import open_repository

pytestmark = pytest.mark.integration


async def test_concurrent_registrations_commit_in_batches(database_url: str, pg: asyncpg.Connection, unique: str) -> None:
    async with open_repository(database_url) as repo:
        batcher = RegistrationBatcher(repo.turns, max_batch=64, workers=1)
        batcher.start()
        try:
            eid = f"d-{unique}"
            await repo.engines.register(wire.engine_spec(engine_request(eid, generation=2), 480), "r")
            good = [wire.retained_blocks(blocks_request("gc", f"{unique}-{i}", eid, list(range(80)), generation=2), 10**6, 10**7) for i in range(200)]
            stale = wire.retained_blocks(blocks_request("gc", f"{unique}-stale", eid, list(range(80)), generation=1), 10**6, 10**7)
            results = await asyncio.gather(*(batcher.register(r) for r in [*good[:100], stale, *good[100:]]), return_exceptions=True)
        finally:
            await batcher.stop()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], BoomerangError) and errors[0].reason == "STALE_GENERATION"
    assert max(batcher.batch_sizes) > 1, batcher.batch_sizes
    stored = await pg.fetchval("SELECT count(*) FROM leases WHERE engine_id = $1", eid)
    assert stored == 200
    ids = {r[0]["lease_id"] for r in results if not isinstance(r, BaseException)}
    assert len(ids) == 200
