"""The registry's repository against the real Postgres: leases, claims, events."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang.errors import BoomerangError, Code
from boomerang.tokenchain import build_chain, common_tokens
from boomerang_registry import wire
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.settings import RegistrySettings
from boomerang_server.leases import ClaimOutcome

from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks, settle

pytestmark = pytest.mark.integration
SETTINGS = RegistrySettings()


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=20) as opened:
        yield opened


async def register_engine(repo: RegistryRepository, engine_id: str, generation: int = 1, ttl: int = 480) -> None:
    await repo.engines.register(wire.engine_spec(engine_request(engine_id, generation, ttl), 480), "req")


async def register(repo: RegistryRepository, tenant: str, conv: str, engine_id: str, tokens: list[int], **kw):  # type: ignore[no-untyped-def]
    req = blocks_request(tenant, conv, engine_id, tokens, **kw)
    return await register_blocks(repo, wire.retained_blocks(req, 10**6, 10**7))


async def claim(repo: RegistryRepository, tenant: str, conv: str, tokens: list[int], **kw):  # type: ignore[no-untyped-def]
    return await repo.claims.claim(wire.claim(claim_request(tenant, conv, tokens, **kw)))


async def events(pg: asyncpg.Connection, lease_id: str) -> list[tuple[str | None, str, str]]:
    rows = await pg.fetch(
        "SELECT from_state, to_state, reason FROM lease_events WHERE lease_id = $1 ORDER BY event_id", uuid.UUID(lease_id)
    )
    return [(r["from_state"], r["to_state"], r["reason"]) for r in rows]


def turn(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


async def test_registration_is_idempotent_on_engine_generation_request(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    tokens = turn(300)
    first, created, _ = await register(repo, "t", unique, f"d-{unique}", tokens, request_id="r1")
    again, created_again, _ = await register(repo, "t", unique, f"d-{unique}", tokens, request_id="r1")
    assert created and not created_again
    assert first["lease_id"] == again["lease_id"]
    count = await pg.fetchval("SELECT count(*) FROM leases WHERE engine_id = $1", f"d-{unique}")
    assert count == 1
    assert await events(pg, first["lease_id"]) == [(None, "RETAINED", "REGISTERED")]


async def test_same_request_id_for_another_conversation_is_refused(repo: RegistryRepository, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    await register(repo, "t", unique, f"d-{unique}", turn(100), request_id="r1")
    with pytest.raises(BoomerangError) as err:
        await register(repo, "t", unique + "-other", f"d-{unique}", turn(100), request_id="r1")
    assert err.value.code is Code.ALREADY_EXISTS


async def test_expiry_is_finish_plus_ttl_minus_margin_on_the_db_clock(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    await register_engine(repo, f"d-{unique}", ttl=60)
    lease, _, _ = await register(repo, "t", unique, f"d-{unique}", turn(100))
    seconds = await pg.fetchval(
        "SELECT EXTRACT(EPOCH FROM expires_at - finished_at) FROM leases WHERE lease_id = $1", uuid.UUID(lease["lease_id"])
    )
    assert float(seconds) == pytest.approx(50.0)
    # A finish time in the future (skewed caller clock) is capped at the registration time.
    future, _, _ = await register(repo, "t", unique + "-f", f"d-{unique}", turn(100), finish_time_unix=4102444800.0)
    assert future["finished_at"] <= future["created_at"]


async def test_new_turn_supersedes_previous_and_is_claimed_once(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    t1 = turn(200)
    old, _, _ = await register(repo, "t", unique, f"d-{unique}", t1)
    t2 = t1 + turn(150, seed=1)
    new, _, superseded = await register(repo, "t", unique, f"d-{unique}", t2)
    assert superseded == 1
    assert await events(pg, old["lease_id"]) == [(None, "RETAINED", "REGISTERED"), ("RETAINED", "SUPERSEDED", "SUPERSEDED")]
    prompt = t2 + turn(40, seed=2)
    outcome, lease, tokens, remaining = await claim(repo, "t", unique, prompt)
    assert outcome is ClaimOutcome.CLAIMED and lease is not None
    assert lease["lease_id"] == new["lease_id"]
    assert tokens == (len(t2) // 16) * 16
    assert 400 < remaining <= 470
    again = await claim(repo, "t", unique, prompt)
    assert again[0] is ClaimOutcome.ALREADY_CLAIMED


async def test_claim_retry_with_same_claim_id_returns_the_same_claim(repo: RegistryRepository, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    t1 = turn(300)
    await register(repo, "t", unique, f"d-{unique}", t1)
    first = await claim(repo, "t", unique, t1 + [1, 2, 3], claim_id="c-1")
    retry = await claim(repo, "t", unique, t1 + [1, 2, 3], claim_id="c-1")
    assert first[0] is retry[0] is ClaimOutcome.CLAIMED
    assert first[1]["lease_id"] == retry[1]["lease_id"] and first[2] == retry[2]


@pytest.mark.parametrize("path", ["single", "batch"])
async def test_a_retry_racing_its_own_claim_gets_that_claim(
    repo: RegistryRepository, pg: asyncpg.Connection, database_url: str, unique: str, path: str
) -> None:
    """A caller retries a claim (same claim id) while the first attempt still runs. Both
    statements looked before either committed, so the one that loses the row lock saw no
    prior claim; it must look again and find its own claim, not answer ALREADY_CLAIMED
    (which left the lease claimed by nobody until an orphan probe gave it back)."""
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    held = turn(300)
    lease, _, _ = await register(repo, "t", unique, eid, held)
    query = wire.claim(claim_request("t", unique, held + [1], claim_id=f"c-{unique}"))

    async def attempt() -> tuple[ClaimOutcome, str]:
        if path == "single":
            outcome, row, _, _ = await repo.claims.claim(query)
        else:
            ((outcome, row, _, _),) = await repo.claims.claim_batch([query])
        return outcome, row["lease_id"] if row is not None else ""

    blocker = await asyncpg.connect(database_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease["lease_id"]))
        attempts = [asyncio.ensure_future(attempt()) for _ in range(2)]
        for _ in range(200):  # both statements wait on the row lock, their snapshots taken
            waiting = await pg.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() "
                # the claim statements (their openings: the text is cut at 1 kB), not another test's
                "AND (query LIKE '%WITH prior AS%' OR query LIKE '%WITH q AS%')"
            )
            if waiting >= 2:
                break
            await asyncio.sleep(0.02)
        assert waiting >= 2
        await tx.commit()
        answers = await asyncio.gather(*attempts)
    finally:
        await blocker.close()
    assert answers == [(ClaimOutcome.CLAIMED, lease["lease_id"])] * 2
    assert [e for e in await events(pg, lease["lease_id"]) if e[1] == "CLAIMED"] == [("RETAINED", "CLAIMED", "CLAIMED")]


async def test_fifty_concurrent_claimers_exactly_one_wins(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    t1 = turn(1000)
    lease, _, _ = await register(repo, "t", unique, f"d-{unique}", t1)
    results = await asyncio.gather(*(claim(repo, "t", unique, t1 + [7]) for _ in range(50)))
    winners = [r for r in results if r[0] is ClaimOutcome.CLAIMED]
    assert len(winners) == 1
    assert all(r[0] is ClaimOutcome.ALREADY_CLAIMED for r in results if r[0] is not ClaimOutcome.CLAIMED)
    claimed_events = await pg.fetchval(
        "SELECT count(*) FROM lease_events WHERE lease_id = $1 AND to_state = 'CLAIMED'", uuid.UUID(lease["lease_id"])
    )
    assert claimed_events == 1


async def test_removed_reasoning_reuses_only_the_verified_prefix(repo: RegistryRepository, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    system, user1 = turn(400, 1), turn(100, 2)
    reasoning, answer = turn(300, 3), turn(80, 4)
    held = system + user1 + reasoning + answer  # what D's KV holds after turn 1
    await register(repo, "t", unique, f"d-{unique}", held)
    # The template strips earlier reasoning: turn 2's prompt diverges where the reasoning was.
    prompt = system + user1 + answer + turn(60, 5)
    outcome, _, tokens, _ = await claim(repo, "t", unique, prompt)
    assert outcome is ClaimOutcome.CLAIMED
    assert tokens == (500 // 16) * 16
    assert tokens <= len(system + user1)


async def test_history_edited_at_the_start_is_a_prefix_mismatch(repo: RegistryRepository, unique: str) -> None:
    await register_engine(repo, f"d-{unique}")
    held = turn(500)
    await register(repo, "t", unique, f"d-{unique}", held)
    edited = [held[0] + 1] + held[1:] + [5, 6]
    outcome, lease, tokens, _ = await claim(repo, "t", unique, edited)
    assert outcome is ClaimOutcome.PREFIX_MISMATCH and tokens == 0 and lease is not None
    assert lease["state"] == "RETAINED"


async def test_below_threshold_and_expiring_and_unknown(repo: RegistryRepository, unique: str) -> None:
    await register_engine(repo, f"d-{unique}", ttl=30)
    held = turn(500)
    await register(repo, "t", unique, f"d-{unique}", held)
    short = held[:40] + [1] * 10
    assert (await claim(repo, "t", unique, short))[0] is ClaimOutcome.BELOW_THRESHOLD
    # ttl 30 - margin 10 = 20 s left: a pull that needs 25 s must not get it.
    assert (await claim(repo, "t", unique, held + [1], min_remaining=25))[0] is ClaimOutcome.EXPIRING
    assert (await claim(repo, "t", unique + "-none", held))[0] is ClaimOutcome.NO_LEASE
    # Another tenant with the same conversation id learns nothing.
    assert (await claim(repo, "other", unique, held + [1]))[0] is ClaimOutcome.NO_LEASE


async def test_expired_leases_are_never_claimed(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    await register_engine(repo, f"d-{unique}", ttl=11)  # 11 s TTL - 10 s margin = 1 s
    held = turn(300)
    await register(repo, "t", unique, f"d-{unique}", held)
    await asyncio.sleep(1.2)
    outcome, _, _, _ = await claim(repo, "t", unique, held + [1], min_remaining=0.0)
    assert outcome is ClaimOutcome.EXPIRING


async def test_generation_bump_invalidates_and_stale_generation_is_refused(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid, generation=1)
    held = turn(300)
    lease, _, _ = await register(repo, "t", unique, eid, held)
    _, invalidated = await repo.engines.register(wire.engine_spec(engine_request(eid, 2), 480), "bump")
    assert invalidated == 1
    assert await events(pg, lease["lease_id"]) == [(None, "RETAINED", "REGISTERED"), ("RETAINED", "INVALIDATED", "GENERATION_ADVANCED")]
    assert (await claim(repo, "t", unique, held + [1]))[0] is ClaimOutcome.NO_LEASE
    with pytest.raises(BoomerangError) as err:
        await register(repo, "t", unique, eid, held, generation=1)
    assert err.value.code is Code.FAILED_PRECONDITION and err.value.reason == "STALE_GENERATION"
    with pytest.raises(BoomerangError) as err:
        await repo.engines.register(wire.engine_spec(engine_request(eid, 1), 480), "old")
    assert err.value.reason == "STALE_GENERATION"


async def test_dead_engine_leases_are_invalidated(repo: RegistryRepository, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    held = turn(300)
    await register(repo, "t", unique, eid, held)
    assert await repo.engines.invalidate(eid, 0, "HEARTBEAT_TIMEOUT", "r") == 1
    assert (await claim(repo, "t", unique, held + [1]))[0] is ClaimOutcome.NO_LEASE
    with pytest.raises(BoomerangError) as err:
        await register(repo, "t", unique, eid, held)
    assert err.value.reason == "ENGINE_DEAD"


async def test_release_and_consume_follow_the_state_machine(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    held = turn(300)
    lease, _, _ = await register(repo, "t", unique, eid, held)
    lid = lease["lease_id"]
    _, _claimed, _, _ = await claim(repo, "t", unique, held + [1], claim_id="c1")
    released = await settle(repo, "t", lid, "c1", read=False)
    assert released["state"] == "RETAINED" and released["claim_id"] is None
    assert (await settle(repo, "t", lid, "c1", read=False))["state"] == "RETAINED"
    with pytest.raises(BoomerangError) as err:
        await settle(repo, "t", lid, "c1", read=True)
    assert err.value.reason == "CLAIM_MISMATCH"
    await claim(repo, "t", unique, held + [1], claim_id="c2")
    consumed = await settle(repo, "t", lid, "c2", read=True)
    assert consumed["state"] == "CONSUMED"
    assert (await settle(repo, "t", lid, "c2", read=True))["state"] == "CONSUMED"
    with pytest.raises(BoomerangError) as err:
        await settle(repo, "other-tenant", lid, "c2", read=True)
    assert err.value.code is Code.NOT_FOUND
    assert await events(pg, lid) == [
        (None, "RETAINED", "REGISTERED"),
        ("RETAINED", "CLAIMED", "CLAIMED"),
        ("CLAIMED", "RETAINED", "PREFILL_DID_NOT_READ"),
        ("RETAINED", "CLAIMED", "CLAIMED"),
        ("CLAIMED", "CONSUMED", "PREFILL_READ"),
    ]
    versions = await pg.fetchval("SELECT version FROM leases WHERE lease_id = $1", uuid.UUID(lid))
    assert versions == 5


async def test_release_after_a_newer_turn_supersedes_instead(repo: RegistryRepository, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    held = turn(300)
    lease, _, _ = await register(repo, "t", unique, eid, held)
    await claim(repo, "t", unique, held + [1], claim_id="c1")
    await register(repo, "t", unique, eid, held + turn(50, 9))
    released = await settle(repo, "t", lease["lease_id"], "c1", read=False)
    assert released["state"] == "SUPERSEDED"


async def test_every_state_change_has_exactly_one_event(repo: RegistryRepository, pg: asyncpg.Connection) -> None:
    mismatched = await pg.fetch(
        """
        SELECT l.lease_id, l.version, count(e.*) AS events FROM leases l
        LEFT JOIN lease_events e ON e.lease_id = l.lease_id
        GROUP BY l.lease_id, l.version HAVING count(e.*) <> l.version
        """
    )
    assert [dict(r) for r in mismatched] == []


async def test_audit_trail_refuses_update_and_delete(pg: asyncpg.Connection) -> None:
    for sql in ("UPDATE lease_events SET reason = 'x'", "DELETE FROM lease_events", "TRUNCATE lease_events"):
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError, match="append-only"):
            await pg.execute(sql)


async def test_sql_prefix_function_matches_the_python_one(pg: asyncpg.Connection) -> None:
    rng = random.Random(42)
    for _ in range(300):
        bs = rng.choice([1, 4, 16])
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 120))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        ca, cb = build_chain(a, bs), build_chain(b, bs)
        got = await pg.fetchval(
            "SELECT boomerang_common_tokens($1, $2, $3, $4, $5, $6, $7)",
            ca.block_hashes, ca.tail_hash, ca.num_tokens, cb.block_hashes, cb.tail_hash, cb.num_tokens, bs,
        )
        assert got == common_tokens(ca, cb)


# The claim is planned against tables the size of a working registry's (20,000 leases: 4,000
# conversations of five turns, four superseded and the last live, on 16 engines), each
# analyzed in full (fewer rows than ANALYZE's 30,000-row sample), so the statistics and the
# plan are the same on every run.
PLAN_PROBE_ENGINES = """
INSERT INTO engines (engine_id, role, model, side_channel_host, side_channel_port, http_base_url,
                     generation, kv_blocks_ttl_seconds, block_size, tp_size, dcp_size, pp_size,
                     bytes_per_block, kv_recompute_threshold, status, registered_at, heartbeat_at,
                     in_flight_requests, queued_prompt_tokens)
SELECT 'd-' || i, 'DECODE', 'm', 'h', 1, 'http://h', 1, 480, 16, 1, 1, 1, 4096, 0, 'ACTIVE',
       now(), now(), 0, 0
FROM generate_series(0, 15) i
"""
PLAN_PROBE_LEASES = """
INSERT INTO leases (lease_id, tenant, conversation_id, model, engine_id, engine_generation,
                    remote_request_id, block_ids, num_blocks, num_tokens, block_size, chain,
                    tail_hash, remote_host, remote_port, tp_size, dcp_size, pp_size, state,
                    finished_at, expires_at)
SELECT gen_random_uuid(), 't' || (i / 5 % 4), 'c-' || (i / 5), 'm', 'd-' || (i % 16), 1,
       'cmpl-' || i, '[]', 1, 16, 16, '', '', 'h', 1, 1, 1, 1,
       CASE WHEN i % 5 = 4 THEN 'RETAINED' ELSE 'SUPERSEDED' END, now(), now() + interval '1 hour'
FROM generate_series(0, 19999) i
"""


async def test_claim_statement_uses_the_live_conversation_index(repo: RegistryRepository) -> None:
    """The planner reaches a claim's leases through ix_leases_live_conversation and never scans
    the leases table. Planned on the shared tables, the choice followed whatever rows other
    tests had left and when autovacuum last sampled them (a loaded run picked another plan);
    so the plan is made on temporary copies of `leases` and `engines` (which shadow them on
    the search path) carrying the migration's own indexes, filled as above, gone at rollback."""
    from boomerang_registry.statements import CLAIM_SQL
    from sqlalchemy import text

    params = {
        "tenant": "t3", "conversation_id": "c-7", "claim_id": "x", "block_size": 16, "chain": b"",
        "tail_hash": b"", "num_tokens": 0, "model": "", "min_tokens": 1, "min_remaining": 5.0, "actor": "test",
    }
    async with repo.owner.connect() as conn:
        indexes = (await conn.execute(text(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename IN ('leases', 'engines')"
        ))).scalars().all()
        assert any("ix_leases_live_conversation" in d for d in indexes), indexes
        for table in ("leases", "engines"):
            await conn.exec_driver_sql(f"CREATE TEMP TABLE {table} (LIKE public.{table} INCLUDING ALL EXCLUDING INDEXES)")
        for definition in indexes:  # same names: a temporary table's indexes live in its own schema
            await conn.exec_driver_sql(definition.replace(" ON public.", " ON pg_temp."))
        await conn.exec_driver_sql(PLAN_PROBE_ENGINES)
        await conn.exec_driver_sql(PLAN_PROBE_LEASES)
        await conn.exec_driver_sql("ANALYZE pg_temp.engines, pg_temp.leases")
        plan = [r[0] for r in await conn.execute(text("EXPLAIN " + CLAIM_SQL), params)]
        await conn.rollback()
    text_plan = "\n".join(plan)
    cands = text_plan.split("CTE cands", 1)[1].split("CTE claimed", 1)[0]  # the candidates' scan
    assert "Index Scan using ix_leases_live_conversation on leases" in cands, text_plan
    assert "Seq Scan on leases" not in text_plan, text_plan


async def test_concurrent_consumes_of_one_claim_move_it_once(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    """A consume is one locked statement: several at once all answer CONSUMED (those that
    waited for the lock read it as the first left it, not as their snapshot had it), one event."""
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    held = turn(300)
    lease, _, _ = await register(repo, "t", unique, eid, held)
    await claim(repo, "t", unique, held + [1], claim_id="c1")
    answers = await asyncio.gather(*(settle(repo, "t", lease["lease_id"], "c1", read=True) for _ in range(4)))
    assert {(a["state"], a["version"]) for a in answers} == {("CONSUMED", answers[0]["version"])}
    assert [e for e in await events(pg, lease["lease_id"]) if e[1] == "CONSUMED"] == [("CLAIMED", "CONSUMED", "PREFILL_READ")]


async def test_heartbeat_answers_the_current_generation_only(repo: RegistryRepository, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid, generation=2)
    row, _ = await repo.engines.heartbeat(eid, 2, in_flight=3, queued=40)
    assert (row["generation"], row["in_flight_requests"], row["queued_prompt_tokens"], row["status"]) == (2, 3, 40, "ACTIVE")
    assert "retained_blocks" in row
    for generation, reason in ((1, "STALE_GENERATION"), (3, "GENERATION_NOT_REGISTERED")):
        with pytest.raises(BoomerangError) as err:
            await repo.engines.heartbeat(eid, generation, 0, 0)
        assert (err.value.code, err.value.reason) == (Code.FAILED_PRECONDITION, reason)
    with pytest.raises(BoomerangError) as err:
        await repo.engines.heartbeat(f"ghost-{unique}", 1, 0, 0)
    assert (err.value.code, err.value.reason) == (Code.NOT_FOUND, "ENGINE_NOT_FOUND")


async def test_a_tenants_listing_pages_through_its_own_leases_only(repo: RegistryRepository, unique: str) -> None:
    eid = f"d-{unique}"
    await register_engine(repo, eid)
    mine = {(await register(repo, f"a-{unique}", f"c{i}", eid, turn(64, i)))[0]["lease_id"] for i in range(5)}
    await register(repo, f"b-{unique}", "c0", eid, turn(64))
    seen: list[str] = []
    token = ""
    while True:
        rows, token = await repo.events.list_leases(f"a-{unique}", eid, ["RETAINED"], 2, token)
        seen += [r["lease_id"] for r in rows]
        if not token:
            break
    assert len(seen) == 5 and set(seen) == mine
    leases, trail = await repo.events.conversation(f"a-{unique}", "c0", include_events=True)
    assert len(leases) == 1 and leases[0]["lease_id"] in mine and leases[0]["tenant"] == f"a-{unique}"
    assert [(e["to_state"], e["reason"]) for e in trail] == [("RETAINED", "REGISTERED")]
    with pytest.raises(BoomerangError) as err:
        await repo.events.conversation(f"a-{unique}", "nobody", include_events=False)
    assert err.value.reason == "CONVERSATION_NOT_FOUND"
