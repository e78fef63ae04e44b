"""The reaper's SQL on the real Postgres: the registry's fenced expiry, engine sweep and
retention statements, the live-lease figures, the deadline notifications, the election row,
and the registration history the advice reads.

These statements act on every lease and engine in the database, so the module runs on a
database of its own rather than the session's shared one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from boomerang.errors import BoomerangError
from boomerang_reaper.advice import TurnRecord, advise
from boomerang_reaper.leader import ClockOffset, LeaderElection, ReaperRepository
from boomerang_registry import wire
from boomerang_registry.expiry import ExpiryRepository, Fence
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.watches import DeadlineHub, Subscription
from boomerang_server.db import make_engine

from tests.support.databases import fresh_database
from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks

pytestmark = pytest.mark.integration
ELECTION = "ttl-reaper"


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    """A fresh migrated database for this module."""
    with fresh_database("boomerang_reaper") as url:
        yield url


@pytest.fixture(scope="module")
async def engine(db_url: str) -> AsyncIterator:  # type: ignore[type-arg]
    eng = make_engine(db_url, pool_size=10)
    yield eng
    await eng.dispose()


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(db_url)
    yield conn
    await conn.close()


@pytest.fixture(scope="module")
async def registry(db_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(db_url, ttl_margin_seconds=0.0) as repo:
        yield repo


@pytest.fixture
async def fence(db: asyncpg.Connection) -> Fence:
    """The current term of the default election, held for a minute."""
    term = await db.fetchval(
        "INSERT INTO reaper_leader (election, holder, term, expires_at) VALUES ($1, 'test', 1, now() + interval '60 s') "
        "ON CONFLICT (election) DO UPDATE SET term = reaper_leader.term + 1, holder = 'test', "
        "expires_at = now() + interval '60 s' RETURNING term",
        ELECTION,
    )
    return Fence(ELECTION, term)


async def new_engine(registry: RegistryRepository, ttl: int = 480, generation: int = 1) -> str:
    engine_id = f"d-{uuid.uuid4().hex[:8]}"
    await registry.engines.register(wire.engine_spec(engine_request(engine_id, generation, ttl), 480), "r")
    return engine_id


async def new_lease(registry: RegistryRepository, engine_id: str, ago: float = 0.0, generation: int = 1) -> str:
    """A lease whose decode request finished `ago` seconds ago (its deadline is that much earlier)."""
    finish = datetime.now(UTC).timestamp() - ago
    req = blocks_request("acme", uuid.uuid4().hex, engine_id, list(range(48)), generation=generation, finish_time_unix=finish)
    row, _, _ = await register_blocks(registry, wire.retained_blocks(req, 10**6, 10**7))
    return str(row["lease_id"])


async def states(db: asyncpg.Connection, ids: list[str]) -> dict[str, str]:
    rows = await db.fetch("SELECT lease_id::text AS id, state FROM leases WHERE lease_id = ANY($1::uuid[])", ids)
    return {r["id"]: r["state"] for r in rows}


async def end_all_live(db: asyncpg.Connection) -> None:
    """Tests that assert on the next deadline start from no live lease (test set-up only)."""
    await db.execute("UPDATE leases SET state = 'CONSUMED' WHERE state IN ('RETAINED', 'CLAIMED')")


async def test_fence_refuses_missing_stale_and_lapsed_terms(engine, registry, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    due = await new_lease(registry, await new_engine(registry, ttl=10), ago=20)
    for bad, why in [
        (Fence("no-such-election", 1), "no reaper has been elected"),
        (Fence(ELECTION, fence.term - 1 if fence.term > 1 else 99), "is not the current term"),
    ]:
        with pytest.raises(BoomerangError) as err:
            await expiry.expire_due(bad, 100, "reaper", "")
        assert err.value.reason == "FENCED" and why in err.value.message
    await db.execute("UPDATE reaper_leader SET expires_at = now() - interval '1 s' WHERE election = $1", ELECTION)
    for call in (
        expiry.expire_due(fence, 100, "reaper", ""),
        expiry.sweep_engines(fence, 1.0, "reaper", ""),
        expiry.enforce_retention(fence, 30, 7),
    ):
        with pytest.raises(BoomerangError) as err:
            await call
        assert err.value.reason == "FENCED" and "lapsed" in err.value.message
        assert err.value.metadata["term"] == str(fence.term)
    assert (await states(db, [due]))[due] == "RETAINED"  # a refused call wrote nothing


async def test_expires_due_leases_once_and_never_early(engine, registry, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    await end_all_live(db)
    expiry = ExpiryRepository(engine)
    short = await new_engine(registry, ttl=10)
    due = await new_lease(registry, short, ago=12)
    claimed = await new_lease(registry, short, ago=11)
    await db.execute("UPDATE leases SET state = 'CLAIMED', claim_id = 'c1' WHERE lease_id = $1", uuid.UUID(claimed))
    later = await new_lease(registry, short, ago=5)  # five seconds to go
    before = await expiry.live_figures()
    assert (before.live, before.overdue) == (3, 2) and before.next_deadline is not None
    out = await expiry.expire_due(fence, 100, "reaper:test", "req-1")
    assert {r["lease_id"]: r["from_state"] for r in out.expired} == {due: "RETAINED", claimed: "CLAIMED"}
    assert all(0.5 < r["lag_seconds"] < 5 for r in out.expired)  # due 2 s and 1 s ago
    assert not out.more_due
    expires_later = await db.fetchval("SELECT expires_at FROM leases WHERE lease_id = $1", uuid.UUID(later))
    assert out.next_deadline == expires_later and out.db_now < expires_later
    after = await expiry.live_figures()
    assert (after.live, after.overdue, after.next_deadline) == (1, 0, expires_later)
    assert await states(db, [due, claimed, later]) == {due: "EXPIRED", claimed: "EXPIRED", later: "RETAINED"}
    again = await expiry.expire_due(fence, 100, "reaper:test", "req-2")
    assert again.expired == []
    rows = await db.fetch(
        "SELECT lease_id::text AS id, e.created_at - l.expires_at AS lag, e.reason, e.actor, e.request_id, e.claim_id, "
        "e.details FROM lease_events e JOIN leases l USING (lease_id) WHERE e.to_state = 'EXPIRED' "
        "AND lease_id = ANY($1::uuid[])",
        [due, claimed, later],
    )
    assert sorted(r["id"] for r in rows) == sorted([due, claimed])  # one event per lease
    for r in rows:
        assert r["lag"] >= timedelta(0) and r["reason"] == "TTL_EXPIRED" and r["actor"] == "reaper:test"
        assert r["request_id"] == "req-1" and '"lag_seconds"' in r["details"] and f'"term": {fence.term}' in r["details"]
    assert [r["claim_id"] for r in rows if r["id"] == claimed] == ["c1"]


async def test_batches_report_more_due_and_concurrent_callers_expire_each_lease_once(engine, registry, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    eid = await new_engine(registry, ttl=10)
    ids = [await new_lease(registry, eid, ago=11 + i * 0.01) for i in range(40)]
    first = await expiry.expire_due(fence, 3, "reaper", "")
    assert len(first.expired) == 3 and first.more_due and first.next_deadline <= first.db_now

    async def drain() -> list[str]:
        got: list[str] = []
        while True:
            out = await expiry.expire_due(fence, 4, "reaper", "")
            got += [r["lease_id"] for r in out.expired]
            if not out.more_due and not out.expired:
                return got

    results = await asyncio.gather(*(drain() for _ in range(5)))
    everyone = [lease for got in results for lease in got] + [r["lease_id"] for r in first.expired]
    assert sorted(everyone) == sorted(ids)  # all of them, none twice
    counts = await db.fetch(
        "SELECT lease_id, count(*) AS n FROM lease_events WHERE to_state = 'EXPIRED' AND lease_id = ANY($1::uuid[]) "
        "GROUP BY lease_id", ids
    )
    assert len(counts) == 40 and {r["n"] for r in counts} == {1}


async def test_sweep_invalidates_silent_dead_and_stale_generation_engines(engine, registry, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    silent, alive, restarted, dead = [await new_engine(registry) for _ in range(4)]
    leases = {eid: await new_lease(registry, eid) for eid in (silent, alive, restarted, dead)}
    await db.execute("UPDATE engines SET heartbeat_at = now() - interval '10 s' WHERE engine_id = $1", silent)
    # A generation the registry recorded without invalidating, and a dead engine with live
    # leases: states the registry's own calls never leave behind, which the sweep still catches.
    await db.execute("UPDATE engines SET generation = 2 WHERE engine_id = $1", restarted)
    await db.execute("UPDATE engines SET status = 'DEAD' WHERE engine_id = $1", dead)
    out = await expiry.sweep_engines(fence, 5.0, "reaper:test", "sweep-1")
    assert silent in out.dead_engine_ids and alive not in out.dead_engine_ids
    assert out.leases_by_reason.get("HEARTBEAT_TIMEOUT", 0) >= 1
    rows = await db.fetch(
        "SELECT l.engine_id, l.state, e.reason, e.actor FROM leases l LEFT JOIN lease_events e "
        "ON e.lease_id = l.lease_id AND e.to_state = 'INVALIDATED' WHERE l.lease_id = ANY($1::uuid[])",
        list(leases.values()),
    )
    got = {r["engine_id"]: (r["state"], r["reason"], r["actor"]) for r in rows}
    assert got[silent] == ("INVALIDATED", "HEARTBEAT_TIMEOUT", "reaper:test")
    assert got[restarted] == ("INVALIDATED", "GENERATION_ADVANCED", "reaper:test")
    assert got[dead] == ("INVALIDATED", "ENGINE_DEAD", "reaper:test")
    assert got[alive] == ("RETAINED", None, None)
    assert await db.fetchval("SELECT status FROM engines WHERE engine_id = $1", silent) == "DEAD"
    off = await expiry.sweep_engines(fence, 0.0, "reaper", "")  # heartbeat check off
    assert off.dead_engine_ids == [] and off.leases_by_reason == {}


async def test_retention_drops_whole_old_partitions_only(engine, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    await db.execute(
        "CREATE TABLE lease_events_p20200101 PARTITION OF lease_events "
        "FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00')"
    )
    await db.execute(
        "INSERT INTO lease_events (lease_id, tenant, conversation_id, to_state, reason, actor, created_at) "
        "VALUES (gen_random_uuid(), 'acme', 'old', 'RETAINED', 'REGISTERED', 'registry', '2020-01-01 12:00+00')"
    )
    await db.execute("SELECT boomerang_ensure_event_partitions(31, 0)")
    today = datetime.now(UTC).date()
    oldest_kept = f"lease_events_p{(today - timedelta(days=30)):%Y%m%d}"
    first_gone = f"lease_events_p{(today - timedelta(days=31)):%Y%m%d}"
    out = await expiry.enforce_retention(fence, retention_days=30, days_ahead=9)
    assert "lease_events_p20200101" in out.dropped and first_gone in out.dropped and out.busy == []
    assert out.created >= 1  # days 8 and 9 ahead did not exist yet
    tables = {r["relname"] for r in await db.fetch("SELECT relname FROM pg_class WHERE relname LIKE 'lease_events_p%'")}
    assert "lease_events_p20200101" not in tables and first_gone not in tables
    assert oldest_kept in tables and f"lease_events_p{(today + timedelta(days=9)):%Y%m%d}" in tables
    assert await db.fetchval("SELECT count(*) FROM lease_events WHERE created_at < '2020-01-02'") == 0
    assert (await expiry.enforce_retention(fence, 30, 9)).dropped == []


async def test_retention_drops_old_plan_record_partitions_too(engine, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    await db.execute(
        "CREATE TABLE turn_plans_p20200102 PARTITION OF turn_plans "
        "FOR VALUES FROM ('2020-01-02 00:00+00') TO ('2020-01-03 00:00+00')"
    )
    today = datetime.now(UTC).date()
    out = await expiry.enforce_retention(fence, retention_days=30, days_ahead=8)
    assert "turn_plans_p20200102" in out.dropped
    tables = {r["relname"] for r in await db.fetch("SELECT relname FROM pg_class WHERE relname LIKE 'turn_plans_p%'")}
    assert "turn_plans_p20200102" not in tables
    assert f"turn_plans_p{(today + timedelta(days=8)):%Y%m%d}" in tables
    assert f"turn_plans_p{today:%Y%m%d}" in tables


async def test_retention_deletes_old_ended_leases_but_never_live_ones(engine, db, fence: Fence) -> None:  # type: ignore[no-untyped-def]
    expiry = ExpiryRepository(engine)
    insert = (
        "INSERT INTO leases (lease_id, tenant, conversation_id, model, engine_id, engine_generation, "
        "remote_request_id, block_ids, num_blocks, num_tokens, block_size, chain, tail_hash, remote_host, "
        "remote_port, tp_size, dcp_size, pp_size, state, finished_at, created_at, expires_at) "
        "VALUES (gen_random_uuid(), 'acme', $1, 'm', 'old-engine', 1, $1, '[[1]]', 1, 16, 16, '', '', 'h', 1, 1, 1, 1, "
        "$2, $3::timestamptz, $3::timestamptz, $3::timestamptz + interval '1 minute') RETURNING lease_id"
    )
    old = datetime(2020, 1, 1, tzinfo=UTC)
    ended = await db.fetchval(insert, "ended-old", "CONSUMED", old)
    live = await db.fetchval(insert, "live-old", "RETAINED", old)
    recent = await db.fetchval(insert, "ended-new", "EXPIRED", datetime.now(UTC))
    out = await expiry.enforce_retention(fence, retention_days=30, days_ahead=7)
    assert out.purged_leases >= 1
    left = {r["lease_id"] for r in await db.fetch("SELECT lease_id FROM leases WHERE lease_id = ANY($1::uuid[])", [ended, live, recent])}
    assert left == {live, recent}


async def test_new_leases_notify_their_deadline_after_commit(db_url: str, registry) -> None:  # type: ignore[no-untyped-def]
    hub = DeadlineHub(db_url)
    sub = await hub.subscribe()
    lease = await new_lease(registry, await new_engine(registry, ttl=30))
    hinted = await asyncio.wait_for(sub.next(), timeout=5)
    conn = await asyncpg.connect(db_url)
    expires = await conn.fetchval("SELECT expires_at FROM leases WHERE lease_id = $1", uuid.UUID(lease))
    await conn.close()
    assert hinted == pytest.approx(expires.timestamp(), abs=1e-5)
    await hub.close()
    with pytest.raises(BoomerangError) as err:
        await sub.next()
    assert err.value.reason == "REGISTRY_DRAINING"


def test_subscription_coalesces_to_the_earliest_pending_deadline() -> None:
    async def run() -> float:
        sub = Subscription()
        for d in (50.0, 3.0, 9.0):
            sub.offer(d)
        return await sub.next()

    assert asyncio.run(run()) == 3.0


async def test_election_row_terms_takeover_and_release(engine) -> None:  # type: ignore[no-untyped-def]
    repo = ReaperRepository(engine)
    election = f"e-{uuid.uuid4().hex[:6]}"
    won, a = await repo.acquire(election, "a", 0.4, {"expired": 1})
    assert won and a is not None and a.term == 1
    won, again = await repo.acquire(election, "a", 0.4, {})
    assert won and again is not None and again.term == 1  # renewal keeps the term
    won, seen = await repo.acquire(election, "b", 0.4, {})
    assert not won and seen is not None and seen.holder == "a" and seen.unexpired
    await asyncio.sleep(0.45)
    won, b = await repo.acquire(election, "b", 0.4, {})
    assert won and b is not None and b.term == 2  # a lapsed lease changes hands with a new term
    assert not (await repo.acquire(election, "a", 0.4, {}))[0]
    assert await repo.release(election, "b", 2, {"expired": 7})
    current = await repo.current(election)
    assert current is not None and not current.unexpired and current.stats == {"expired": 7}
    won, a2 = await repo.acquire(election, "a", 0.4, {})
    assert won and a2 is not None and a2.term == 3
    await asyncio.sleep(0.45)
    won, a3 = await repo.acquire(election, "a", 0.4, {})  # its own lapsed lease: a new term too
    assert won and a3 is not None and a3.term == 4


async def test_concurrent_contenders_elect_exactly_one(engine) -> None:  # type: ignore[no-untyped-def]
    repo = ReaperRepository(engine)
    election = f"e-{uuid.uuid4().hex[:6]}"
    results = await asyncio.gather(*(repo.acquire(election, f"r{i}", 5.0, {}) for i in range(8)))
    assert sum(won for won, _ in results) == 1


async def test_standby_takes_over_within_one_lease_of_a_silent_death(engine) -> None:  # type: ignore[no-untyped-def]
    repo = ReaperRepository(engine)
    election = f"e-{uuid.uuid4().hex[:6]}"
    lease = 0.9
    a = LeaderElection(repo, election, "a", lease, ClockOffset(), dict)
    b = LeaderElection(repo, election, "b", lease, ClockOffset(), dict)
    ta = asyncio.create_task(a.run())
    await asyncio.wait_for(a.wait_for_leadership(), 5)
    tb = asyncio.create_task(b.run())
    await asyncio.sleep(0.5)
    assert a.leader and not b.leader
    ta.cancel()  # dies without releasing
    died = asyncio.get_running_loop().time()
    await asyncio.gather(ta, return_exceptions=True)
    term = await asyncio.wait_for(b.wait_for_leadership(), 5)
    took = asyncio.get_running_loop().time() - died
    tb.cancel()
    await asyncio.gather(tb, return_exceptions=True)
    assert term == a.term + 1 and took <= lease + 0.15, took


async def test_registrations_page_a_fixed_window_and_feed_the_advice(registry) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    eid = await new_engine(registry, ttl=480)
    conv = uuid.uuid4().hex
    tokens = list(range(64))
    for k in range(2):
        req = blocks_request(tenant, conv, eid, tokens[: 32 + 16 * k])
        await register_blocks(registry, wire.retained_blocks(req, 10**6, 10**7))
        if k == 0:
            outcome, *_ = await registry.claims.claim(wire.claim(claim_request(tenant, conv, tokens, min_tokens=16)))
            assert outcome.value == "CLAIMED"
    first_page, since, until, token = await registry.events.registrations(tenant, 1.0, 1, "")
    assert since < until and len(first_page) == 1 and token
    # A registration after the first page is outside its window: the pages list what it fixed.
    await register_blocks(registry, wire.retained_blocks(blocks_request(tenant, "later", eid, tokens), 10**6, 10**7))
    second_page, since2, until2, last = await registry.events.registrations(tenant, 1.0, 1, token)
    assert (since2, until2, last) == (since, until, "") and len(second_page) == 1
    rows = [*first_page, *second_page]
    assert rows[0]["created_at"] > rows[1]["created_at"]  # newest first
    records = [
        TurnRecord(tenant=r["tenant"], model=r["model"], conversation_id=r["conversation_id"], lease_id=r["lease_id"],
                   finished_at=r["finished_at"].timestamp(), num_blocks=r["num_blocks"],
                   bytes_per_block=r["bytes_per_block"], engine_ttl_seconds=r["engine_ttl_seconds"],
                   claimed_at=r["claimed_at"].timestamp() if r["claimed_at"] else None, state=r["state"])
        for r in rows
    ]
    first = min(records, key=lambda r: r.finished_at)
    assert first.claimed_at is not None and first.claimed_at >= first.finished_at
    assert first.bytes_per_block == 4096 and first.engine_ttl_seconds == 480 and first.num_blocks == 2
    (a,) = advise(records, safety=0.0)
    assert (a.turns, a.next_turns, a.exact_pauses) == (2, 1, 1)
    assert a.recommended_ttl_seconds == 1  # the claim came well within a second
