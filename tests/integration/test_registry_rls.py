"""Row-level security: the second wall between tenants, below the queries' own predicates."""

from __future__ import annotations

import asyncpg
import pytest
from boomerang_registry import wire

from tests.support.registry_data import blocks_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks

pytestmark = pytest.mark.integration


async def test_tenant_role_sees_and_changes_only_its_tenant(database_url: str, unique: str) -> None:
    async with open_repository(database_url, size=2) as repo:
        eid = f"d-{unique}"
        await repo.engines.register(wire.engine_spec(engine_request(eid), 480), "r")
        for tenant in ("alpha", "beta"):
            await register_blocks(repo,
                wire.retained_blocks(blocks_request(f"{tenant}-{unique}", "same-conversation", eid, list(range(64))), 10**6, 10**7)
            )

    conn = await asyncpg.connect(database_url, server_settings={"role": "boomerang_service"})
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('boomerang.tenant', $1, true)", f"alpha-{unique}")
            # A query that forgets its tenant predicate still sees only alpha's rows...
            tenants = {r["tenant"] for r in await conn.fetch("SELECT tenant FROM leases WHERE engine_id = $1", eid)}
            assert tenants == {f"alpha-{unique}"}
            events = await conn.fetch("SELECT DISTINCT tenant FROM lease_events")
            assert {r["tenant"] for r in events} == {f"alpha-{unique}"}
            # ...cannot change beta's...
            changed = await conn.execute(
                "UPDATE leases SET state = 'CONSUMED' WHERE tenant = $1", f"beta-{unique}"
            )
            assert changed == "UPDATE 0"
        # ...and cannot write rows for another tenant.
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError, match="row-level security"):
            async with conn.transaction():
                await conn.execute("SELECT set_config('boomerang.tenant', $1, true)", f"alpha-{unique}")
                await conn.execute(
                    "INSERT INTO lease_events (lease_id, tenant, conversation_id, to_state, reason, actor) "
                    "VALUES (gen_random_uuid(), $1, 'c', 'RETAINED', 'FORGED', 'test')",
                    f"beta-{unique}",
                )
        # Without a tenant set, nothing is visible at all.
        assert await conn.fetchval("SELECT count(*) FROM leases") == 0
    finally:
        await conn.close()
