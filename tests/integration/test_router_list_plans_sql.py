"""ListTurnPlans' read of `turn_plans` on the real Postgres: a page is one index range of
ix_turn_plans_conversation in key order, and plans that share a millisecond (so a
`created_at`) still page in plan id order without a duplicate or a gap."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from boomerang_router.domain import PlanDecision, PlanReason
from boomerang_router.plan_store import PlanRecord, plan_time
from boomerang_router.repository import CONVERSATION_PAGE_SQL, TurnPlanRepository, to_row
from boomerang_server.db import make_engine
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(database_url, 2)
    yield e
    await e.dispose()


def _plan_id(ms: int, n: int) -> str:
    """A UUIDv7 of the millisecond `ms`, its random bits `n` (ids of one millisecond sort by n)."""
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | n))


def _record(plan_id: str, tenant: str, conversation: str) -> PlanRecord:
    return PlanRecord(plan_id, plan_time(plan_id), tenant, conversation, "m", "", PlanDecision.COLD,
                      PlanReason.NO_LEASE, "p", "http://p", "d", "http://d", 10, 0, 10, 0, 64)


async def test_pages_follow_the_plan_id_within_one_millisecond(engine: AsyncEngine, unique: str) -> None:
    repo = TurnPlanRepository(engine)
    ms = int(time.time() * 1000)  # today's partition
    ids = [_plan_id(ms, n) for n in (5, 1, 9, 3, 7)] + [_plan_id(ms + 1, 0)]
    await repo.upsert([to_row(_record(i, f"t-{unique}", "c")) for i in ids])
    await repo.upsert([to_row(_record(_plan_id(ms, 4), f"other-{unique}", "c"))])  # another tenant's
    listed: list[str] = []
    after = ""
    while True:
        page = await repo.conversation_page(f"t-{unique}", "c", after, 2)
        listed += [p.plan_id for p in page]
        if len(page) < 2:
            break
        after = page[-1].plan_id
    assert listed == sorted(ids, key=lambda i: (plan_time(i), uuid.UUID(i)))
    assert await repo.conversation_page(f"t-{unique}", "c", ids[-1], 2) == []


async def test_a_page_reads_one_range_of_the_conversation_index(engine: AsyncEngine, unique: str) -> None:
    # A tenant's many conversations, so the planner weighs the indexes as on a real table.
    tenant, ms = f"t-{unique}", int(time.time() * 1000)
    repo = TurnPlanRepository(engine)
    ids = [_plan_id(ms + n // 300, n) for n in range(3000)]
    await repo.upsert([to_row(_record(i, tenant, f"c{n % 300}")) for n, i in enumerate(ids)])
    params = {"tenant": tenant, "conversation": "c7", "after_created": plan_time(ids[7]), "after_id": ids[7],
              "limit": 101}
    async with engine.connect() as conn:
        await conn.execute(text("ANALYZE turn_plans"))
        part = (await conn.execute(text("SELECT tableoid::regclass::text FROM turn_plans WHERE plan_id = :p"),
                                   {"p": ids[7]})).scalar_one()
        plan = [r[0] for r in await conn.execute(text("EXPLAIN " + CONVERSATION_PAGE_SQL), params)]
    scans = [line for line in plan if f" on {part} " in line]
    assert scans and all("tenant_conversation_id_created_at_idx" in line for line in scans), "\n".join(plan)
    assert len(await repo.conversation_page(tenant, "c7", ids[7], 100)) == 9
