"""ClaimReuseBatch's statement against the real Postgres: many claims, one statement, same rules.

A batched claim must answer exactly as ClaimReuse would: at
most one claim per lease (across batches and single claims racing each other), never a
lease of another tenant, only a verified prefix, and a retried claim id returns its claim.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang_registry import wire
from boomerang_registry.claim_store import SET_TENANTS_LOCAL, TenantPool
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.statements import CLAIM_BATCH_SQL
from boomerang_registry.wire import ClaimQuery
from boomerang_server.db import make_engine
from boomerang_server.leases import ClaimOutcome

from tests.integration.test_registry_repository import register, register_engine, turn
from tests.support.registry_data import claim_request
from tests.support.registry_repo import open_repository, register_batch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=20) as opened:
        yield opened


def query(tenant: str, conv: str, tokens: list[int], **kw) -> ClaimQuery:  # type: ignore[no-untyped-def]
    return wire.claim(claim_request(tenant, conv, tokens, **kw))


async def claimed_events(pg: asyncpg.Connection, lease_id: str) -> int:
    return int(await pg.fetchval(
        "SELECT count(*) FROM lease_events WHERE lease_id = $1 AND to_state = 'CLAIMED'", uuid.UUID(lease_id)
    ))


async def test_fifty_concurrent_claimers_in_several_batches_exactly_one_wins(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    hot = turn(1000)
    lease, _, _ = await register(repo, "t", f"hot-{unique}", eid, hot)
    others = []
    for k in range(10):
        tokens = turn(200, seed=k + 1)
        await register(repo, "t", f"other{k}-{unique}", eid, tokens)
        others.append(tokens)
    # 10 batches race: each has 4 claims on the hot conversation (so several rounds in one
    # call) and one on its own other conversation; 10 single claims race them too.
    batches = [
        [query("t", f"hot-{unique}", hot + [7]) for _ in range(4)] + [query("t", f"other{k}-{unique}", others[k] + [1])]
        for k in range(10)
    ]
    singles = [repo.claims.claim(query("t", f"hot-{unique}", hot + [7])) for _ in range(10)]
    batch_results, single_results = await asyncio.gather(
        asyncio.gather(*(repo.claims.claim_batch(b) for b in batches)), asyncio.gather(*singles)
    )
    hot_results = [r for res in batch_results for r in res[:4]] + list(single_results)
    assert len(hot_results) == 50
    winners = [r for r in hot_results if r[0] is ClaimOutcome.CLAIMED]
    assert len(winners) == 1 and winners[0][1] is not None
    assert winners[0][1]["lease_id"] == lease["lease_id"]
    assert {r[0] for r in hot_results if r is not winners[0]} == {ClaimOutcome.ALREADY_CLAIMED}
    assert await claimed_events(pg, lease["lease_id"]) == 1
    # Every other conversation's claim, one per batch, won its own lease.
    for res in batch_results:
        assert res[4][0] is ClaimOutcome.CLAIMED
    assert len({res[4][1]["lease_id"] for res in batch_results}) == 10


async def test_a_batch_never_crosses_tenants(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    tokens = turn(400)
    conv = f"shared-{unique}"
    alpha, _, _ = await register(repo, f"alpha-{unique}", conv, eid, tokens)
    beta, _, _ = await register(repo, f"beta-{unique}", conv, eid, tokens)
    # Same conversation id, same prompt, three tenants in one statement; gamma has nothing.
    results = await repo.claims.claim_batch([
        query(f"gamma-{unique}", conv, tokens + [1]),
        query(f"alpha-{unique}", conv, tokens + [1]),
        query(f"beta-{unique}", conv, tokens + [1]),
    ])
    assert results[0][0] is ClaimOutcome.NO_LEASE and results[0][1] is None
    assert results[1][0] is ClaimOutcome.CLAIMED and results[1][1]["lease_id"] == alpha["lease_id"]
    assert results[2][0] is ClaimOutcome.CLAIMED and results[2][1]["lease_id"] == beta["lease_id"]
    assert results[1][1]["tenant"] == f"alpha-{unique}" and results[2][1]["tenant"] == f"beta-{unique}"
    rows = await pg.fetch(
        "SELECT tenant, lease_id FROM lease_events WHERE conversation_id = $1 AND to_state = 'CLAIMED'", conv
    )
    assert {(r["tenant"], str(r["lease_id"])) for r in rows} == {
        (f"alpha-{unique}", alpha["lease_id"]), (f"beta-{unique}", beta["lease_id"])
    }


async def test_batched_claims_answer_as_single_claims(repo: RegistryRepository, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    t1 = turn(300, seed=1)
    for name in ("retry", "edited", "short", "fresh"):
        await register(repo, "t", f"{name}-{unique}", eid, t1)
    first = await repo.claims.claim(query("t", f"retry-{unique}", t1 + [5], claim_id="c-1"))
    edited = [t1[0] + 1] + t1[1:]
    results = await repo.claims.claim_batch([
        query("t", f"retry-{unique}", t1 + [5], claim_id="c-1"),        # a retry: the same claim
        query("t", f"edited-{unique}", edited),                          # history edited at the start
        query("t", f"short-{unique}", t1 + [5], min_tokens=10_000),     # below the caller's floor
        query("t", f"none-{unique}", t1),                                # no lease at all
        query("t", f"fresh-{unique}", t1[:200] + [9] * 50),              # only the verified prefix
    ])
    assert results[0][0] is ClaimOutcome.CLAIMED and results[0][1]["lease_id"] == first[1]["lease_id"]
    assert results[0][2] == first[2]
    assert results[1][0] is ClaimOutcome.PREFIX_MISMATCH
    assert results[2][0] is ClaimOutcome.BELOW_THRESHOLD
    assert results[3][0] is ClaimOutcome.NO_LEASE
    assert results[4][0] is ClaimOutcome.CLAIMED and results[4][2] == 192  # 12 full blocks of 16


async def test_two_claims_on_one_conversation_in_one_batch_take_one_lease(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    tokens = turn(500)
    lease, _, _ = await register(repo, "t", unique, eid, tokens)
    results = await repo.claims.claim_batch([query("t", unique, tokens + [1]) for _ in range(3)])
    assert [r[0] for r in results] == [ClaimOutcome.CLAIMED, ClaimOutcome.ALREADY_CLAIMED, ClaimOutcome.ALREADY_CLAIMED]
    assert await claimed_events(pg, lease["lease_id"]) == 1


async def test_batch_tenants_setting_admits_only_the_named_tenants(
    repo: RegistryRepository, database_url: str, unique: str
) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    for tenant in ("a", "b", "c"):
        await register(repo, f"{tenant}-{unique}", "conv", eid, turn(64))
    conn = await asyncpg.connect(database_url, server_settings={"role": "boomerang_service"})
    try:
        async with conn.transaction():
            await conn.execute(SET_TENANTS_LOCAL.replace(":t", "$1"), f"a-{unique} b-{unique}")
            seen = {r["tenant"] for r in await conn.fetch("SELECT tenant FROM leases WHERE engine_id = $1", eid)}
            assert seen == {f"a-{unique}", f"b-{unique}"}
            changed = await conn.execute("UPDATE leases SET state = 'CONSUMED' WHERE tenant = $1", f"c-{unique}")
            assert changed == "UPDATE 0"
        # The setting was local to that transaction: nothing is visible after it.
        assert await conn.fetchval("SELECT count(*) FROM leases WHERE engine_id = $1", eid) == 0
        # A prefix of a tenant id is not that tenant.
        async with conn.transaction():
            await conn.execute(SET_TENANTS_LOCAL.replace(":t", "$1"), "a")
            assert await conn.fetchval("SELECT count(*) FROM leases WHERE engine_id = $1", eid) == 0
    finally:
        await conn.close()


async def test_batch_statement_uses_the_live_conversation_index(repo: RegistryRepository) -> None:
    from sqlalchemy import text

    params = {
        "i": [0, 1], "tenant": ["t", "u"], "conversation_id": ["c", "d"], "claim_id": ["x", "y"],
        "block_size": [16, 16], "chain": [b"", b""], "tail_hash": [b"", b""], "num_tokens": [0, 0],
        "model": ["", ""], "min_tokens": [1, 1], "min_remaining": [5.0, 5.0], "actor": "test",
    }
    async with repo.owner.connect() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in await conn.execute(text("EXPLAIN " + CLAIM_BATCH_SQL), params))
        await conn.rollback()
    assert "ix_leases_live_conversation" in plan
    assert "Seq Scan on leases" not in plan


async def test_a_batch_leaves_no_tenant_list_on_its_pooled_connection(database_url: str, unique: str) -> None:
    engine = make_engine(database_url, pool_size=2)
    raw = await TenantPool.open(database_url, 1, "boomerang_service")  # one connection: every use shares it
    repo = RegistryRepository(engine, raw, 10.0)
    try:
        eid = f"d-{unique}"
        await register_engine(repo, eid)
        tokens = turn(64)
        for tenant in ("a", "b", "c"):
            await register(repo, f"{tenant}-{unique}", "conv", eid, tokens)
        got = await repo.claims.claim_batch([query(f"a-{unique}", "conv", tokens + [1]), query(f"b-{unique}", "conv", tokens + [1])])
        assert [r[0] for r in got] == [ClaimOutcome.CLAIMED, ClaimOutcome.CLAIMED]
        sql = "SELECT DISTINCT tenant FROM leases WHERE engine_id = :e"
        seen = {r["tenant"] for r in await raw.fetch_as(f"c-{unique}", sql, {"e": eid}, "test")}
        assert seen == {f"c-{unique}"}
        async with raw.transaction(f"c-{unique}") as tx:  # as a release sets it
            assert {r["tenant"] for r in await tx.fetch(sql, {"e": eid})} == {f"c-{unique}"}
        async with raw.transaction() as tx:
            await tx.as_tenants([f"c-{unique}"])  # as the group commit sets it
            assert {r["tenant"] for r in await tx.fetch(sql, {"e": eid})} == {f"c-{unique}"}
    finally:
        await raw.close()
        await engine.dispose()


async def test_warm_up_prepares_the_claims_and_changes_nothing(database_url: str, pg: asyncpg.Connection) -> None:
    from boomerang_registry.statements import CLAIM_BATCH_SQL as BATCH
    from boomerang_registry.statements import CLAIM_SQL, WARM_UP

    before = await pg.fetchval("SELECT count(*) FROM lease_events")
    raw = await TenantPool.open(database_url, 2, "boomerang_service", warm=WARM_UP)
    try:
        async with raw.pool.acquire() as conn:
            prepared = {r["statement"] for r in await conn.fetch("SELECT statement FROM pg_prepared_statements")}
        assert {raw.compile(CLAIM_SQL)[0], raw.compile(BATCH)[0]} <= prepared
    finally:
        await raw.close()
    assert await pg.fetchval("SELECT count(*) FROM lease_events") == before


async def test_one_statement_registers_a_batch_and_each_supersedes_its_own_conversation(
    database_url: str, pg: asyncpg.Connection, unique: str
) -> None:
    from boomerang.errors import BoomerangError

    from tests.support.registry_data import blocks_request

    engine = make_engine(database_url, pool_size=2)
    raw = await TenantPool.open(database_url, 2, "boomerang_service")
    repo = RegistryRepository(engine, raw, 10.0)
    try:
        eid = f"d-{unique}"
        await register_engine(repo, eid)
        now = __import__("time").time()
        old, _, _ = await register(repo, f"a-{unique}", "conv", eid, turn(64), finish_time_unix=now - 10)

        def blocks(tenant: str, conv: str, n: int, finish: float, **kw):  # type: ignore[no-untyped-def]
            return wire.retained_blocks(
                blocks_request(f"{tenant}-{unique}", conv, eid, turn(n), finish_time_unix=finish, **kw), 10**6, 10**7
            )

        batch = [
            blocks("a", "conv", 80, now - 2),            # supersedes `old`
            blocks("b", "conv", 80, now - 2),            # same conversation id, other tenant: nothing to supersede
            blocks("a", "conv", 96, now - 1),            # the same conversation again: next round, supersedes the first
            blocks("a", "other", 80, now - 2, generation=7),  # refused: the engine is at generation 1
        ]
        out = await register_batch(repo, batch)
        repeat = await register_batch(repo, [batch[1]])
    finally:
        await raw.close()
        await engine.dispose()
    assert isinstance(out[3], BoomerangError) and out[3].code.value == "FAILED_PRECONDITION"
    (a1, c1, s1), (b1, cb, sb), (a2, c2, s2) = out[:3]  # type: ignore[misc]
    assert (c1, s1, cb, sb, c2, s2) == (True, 1, True, 0, True, 1)
    assert repeat[0][1] is False and repeat[0][0]["lease_id"] == b1["lease_id"]  # type: ignore[index]
    states = {str(r["lease_id"]): r["state"] for r in await pg.fetch(
        "SELECT lease_id, state FROM leases WHERE engine_id = $1", eid)}
    assert states == {old["lease_id"]: "SUPERSEDED", a1["lease_id"]: "SUPERSEDED", b1["lease_id"]: "RETAINED",
                      a2["lease_id"]: "RETAINED"}
    events = [(str(r["lease_id"]), r["reason"], r["details"]) for r in await pg.fetch(
        "SELECT e.lease_id, e.reason, e.details::text AS details FROM lease_events e JOIN leases l USING (lease_id) "
        "WHERE l.engine_id = $1 ORDER BY e.event_id", eid)]
    assert sorted(e[:2] for e in events) == sorted([
        (old["lease_id"], "REGISTERED"), (a1["lease_id"], "REGISTERED"), (b1["lease_id"], "REGISTERED"),
        (a2["lease_id"], "REGISTERED"), (old["lease_id"], "SUPERSEDED"), (a1["lease_id"], "SUPERSEDED"),
    ])
    by = {e[0]: e[2] for e in events if e[1] == "SUPERSEDED"}
    assert a1["lease_id"] in by[old["lease_id"]] and a2["lease_id"] in by[a1["lease_id"]]
