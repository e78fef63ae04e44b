"""`boomerang reaper` replicas and `boomerang registry` as real processes on the real Postgres.

One registry (TTL margin 0, so a lease's deadline is its engine's TTL) and two reaper
replicas (leadership lease 2 s, engines silent for 1.5 s die) share a database of this
module's own: the reaper acts on every lease and engine in it. The tests run in file order;
the last one kills the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.base import call as unary
from boomerang.clients.reaper import ReaperClient
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_reaper.registry_client import ReaperRegistryClient

from tests.support.databases import execute, fresh_database
from tests.support.procs import BOOMERANG, ServiceProcess
from tests.support.registry_data import blocks_request, claim_request, engine_request

pytestmark = pytest.mark.e2e
LEASE_SECONDS = 2.0
OLD_PARTITION = "lease_events_p20200101"


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    """A fresh migrated database for this module, with an audit partition from 2020."""
    with fresh_database("boomerang_reaper_e2e") as url:
        asyncio.run(execute(url, f"CREATE TABLE {OLD_PARTITION} PARTITION OF lease_events "
                                 "FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00')"))
        yield url


@pytest.fixture(scope="module")
def registry(db_url: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(
        ["registry", "--listen", "127.0.0.1:0", "--ttl-margin-seconds", "0"], {"BOOMERANG_DATABASE_URL": db_url}
    ).start()
    yield proc
    proc.kill()


def start_reaper(db_url: str, registry: ServiceProcess, replica: str) -> ServiceProcess:
    args = [
        "reaper", "--listen", "127.0.0.1:0", "--registry", registry.address, "--replica-id", replica,
        "--leader-lease-seconds", str(LEASE_SECONDS), "--engine-heartbeat-timeout-seconds", "1.5",
        "--engine-sweep-interval-seconds", "0.25",
    ]
    return ServiceProcess(args, {"BOOMERANG_DATABASE_URL": db_url, "BOOMERANG_DRAIN_DELAY_SECONDS": "0"}, name=replica).start()


async def status(proc: ServiceProcess) -> pb.TTLReaperServiceGetStatusResponse:
    async with ReaperClient(proc.address) as client:
        return await client.get_status()


@pytest.fixture(scope="module")
def reapers(db_url: str, registry: ServiceProcess) -> Iterator[dict[str, ServiceProcess]]:
    """Replica `a` (elected first, so it leads) and the standby `b`."""
    a = start_reaper(db_url, registry, "reaper-a")
    deadline = time.monotonic() + 10
    while not asyncio.run(status(a)).leader:
        assert time.monotonic() < deadline, a.output()
        time.sleep(0.05)
    b = start_reaper(db_url, registry, "reaper-b")
    yield {"a": a, "b": b}
    for proc in (a, b):
        proc.kill()


@pytest.fixture
async def client(registry: ServiceProcess) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(registry.address) as c:
        yield c


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(db_url)
    yield conn
    await conn.close()


@contextlib.asynccontextmanager
async def heartbeating(client: RegistryClient, engines: dict[str, int]) -> AsyncIterator[dict[str, int]]:
    """Heartbeat `engines` (id → generation; the test may change it) every 0.2 s."""

    async def beat() -> None:
        while True:
            for engine_id, generation in list(engines.items()):
                await client.heartbeat(rpb.HeartbeatRequest(engine_id=engine_id, registration_generation=generation))
            await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        yield engines
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def new_engine(client: RegistryClient, ttl: int = 480, generation: int = 1) -> str:
    engine_id = f"d-{uuid.uuid4().hex[:8]}"
    await client.register_engine(engine_request(engine_id, generation, ttl))
    return engine_id


async def new_lease(client: RegistryClient, engine_id: str, finish: float = 0.0, generation: int = 1,
                    tenant: str = "acme", conversation: str = "") -> str:
    req = blocks_request(tenant, conversation or uuid.uuid4().hex, engine_id, list(range(40)),
                         generation=generation, finish_time_unix=finish)
    return (await client.register_retained_blocks(req)).lease.lease_id


async def expiry_events(db: asyncpg.Connection, ids: list[str]) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT e.lease_id::text AS id, e.from_state, e.actor, e.created_at - l.expires_at AS lag "
        "FROM lease_events e JOIN leases l USING (lease_id) WHERE e.to_state = 'EXPIRED' AND e.lease_id = ANY($1::uuid[])",
        ids,
    )


async def test_standby_names_the_leader_and_refuses_reap_now(reapers: dict[str, ServiceProcess]) -> None:
    a, b = await status(reapers["a"]), await status(reapers["b"])
    assert a.leader and a.replica_id == "reaper-a" and a.term >= 1
    assert not b.leader and b.replica_id == "reaper-b"
    assert b.leader_replica_id == "reaper-a" and b.term == a.term
    async with ReaperClient(reapers["b"].address) as standby:
        with pytest.raises(BoomerangClientError) as err:
            await standby.reap_now(pb.ReapNowRequest())
    assert err.value.code == "FAILED_PRECONDITION" and err.value.reason == "NOT_LEADER"
    assert err.value.error.metadata.get("leader") == "reaper-a" or "reaper-a" in str(err.value)
    async with ReaperClient(reapers["a"].address) as leader:
        done = await leader.reap_now(pb.ReapNowRequest(sweep_engines=True))
        assert done.term == a.term
        with pytest.raises(BoomerangClientError) as bad:
            await leader.reap_now(pb.ReapNowRequest(request_id="has space"))
        assert bad.value.code == "INVALID_ARGUMENT"
        assert [v.field for v in bad.value.error.violations] == ["request_id"]


async def test_retention_drops_old_partitions(reapers: dict[str, ServiceProcess], db: asyncpg.Connection) -> None:
    # The leader enforced retention when it was elected: the 2020 partition is gone.
    assert await db.fetchval("SELECT to_regclass($1)", OLD_PARTITION) is None
    await db.execute(
        "CREATE TABLE lease_events_p20200202 PARTITION OF lease_events "
        "FOR VALUES FROM ('2020-02-02 00:00+00') TO ('2020-02-03 00:00+00')"
    )
    async with ReaperClient(reapers["a"].address) as leader:
        done = await leader.reap_now(pb.ReapNowRequest(enforce_retention=True))
    assert list(done.dropped_partitions) == ["lease_events_p20200202"]
    today = f"lease_events_p{datetime.now(UTC):%Y%m%d}"
    ahead = f"lease_events_p{datetime.now(UTC) + timedelta(days=7):%Y%m%d}"
    assert await db.fetchval("SELECT to_regclass($1)", today) is not None
    assert await db.fetchval("SELECT to_regclass($1)", ahead) is not None
    # The leader publishes its counters with each renewal (every third of its lease).
    deadline = time.monotonic() + LEASE_SECONDS
    while (await status(reapers["b"])).dropped_partitions < 2:
        assert time.monotonic() < deadline, "the standby never reported the leader's drops"
        await asyncio.sleep(0.1)


async def test_mixed_ttls_expire_within_a_second_and_never_before(
    reapers: dict[str, ServiceProcess], client: RegistryClient, db: asyncpg.Connection
) -> None:
    engines = {await new_engine(client, ttl=ttl): 1 for ttl in (5, 4, 3, 2)}  # longest first
    async with heartbeating(client, engines):
        ids: list[str] = []
        now = time.time()
        for engine_id in engines:  # long TTLs registered before short ones, each with spread finishes
            for back in (0.0, 0.4, 0.8):
                ids.append(await new_lease(client, engine_id, finish=now - back))
        conv = uuid.uuid4().hex
        tokens = list(range(40))
        claimed = await new_lease(client, list(engines)[-1], conversation=conv)  # 2 s TTL
        got = await client.claim_reuse(claim_request("acme", conv, tokens + [7], min_tokens=16, min_remaining=0.5))
        assert got.outcome == rpb.CLAIM_OUTCOME_CLAIMED and got.lease.lease_id == claimed
        ids.append(claimed)
        deadlines = {
            r["id"]: r["expires_at"]
            for r in await db.fetch("SELECT lease_id::text AS id, expires_at FROM leases WHERE lease_id = ANY($1::uuid[])", ids)
        }
        # Watch from outside as well: no lease may be seen expired while its deadline is ahead.
        seen_early: list[str] = []
        end = max(deadlines.values()) + timedelta(seconds=1.5)
        while (db_now := await db.fetchval("SELECT now()")) < end:
            for r in await db.fetch("SELECT lease_id::text AS id, state FROM leases WHERE lease_id = ANY($1::uuid[])", ids):
                if r["state"] == "EXPIRED" and db_now < deadlines[r["id"]]:
                    seen_early.append(r["id"])
            await asyncio.sleep(0.05)
    assert seen_early == []
    events = await expiry_events(db, ids)
    assert sorted(e["id"] for e in events) == sorted(ids)  # every lease, exactly once
    lags = [e["lag"].total_seconds() for e in events]
    assert min(lags) >= 0 and max(lags) <= 1.0, sorted(lags)
    assert [e["from_state"] for e in events if e["id"] == claimed] == ["CLAIMED"]
    assert {e["actor"] for e in events} == {"reaper:reaper-a"}
    print(f"\nexpiry lag over {len(lags)} leases: p50 {sorted(lags)[len(lags) // 2] * 1000:.1f} ms, "
          f"max {max(lags) * 1000:.1f} ms")
    st = await status(reapers["a"])
    assert st.expired_leases >= len(ids) and 0 <= st.expiry_lag.max_seconds <= 1.0
    assert st.backlog_leases == 0


async def test_generation_bump_and_silent_engine_invalidate(
    reapers: dict[str, ServiceProcess], client: RegistryClient, db: asyncpg.Connection
) -> None:
    bumped, restarted, silent, healthy = [await new_engine(client) for _ in range(4)]
    async with heartbeating(client, {bumped: 1, restarted: 1, healthy: 1}) as beating:
        leases = {eid: await new_lease(client, eid) for eid in (bumped, restarted, silent, healthy)}
        resp = await client.register_engine(engine_request(bumped, generation=2))
        beating[bumped] = 2
        assert resp.invalidated_leases == 1
        # A restart the registry recorded without ending the old generation's leases: the
        # reaper's sweep is what ends them.
        await db.execute("UPDATE engines SET generation = 2 WHERE engine_id = $1", restarted)
        beating[restarted] = 2
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            rows = await db.fetch(
                "SELECT l.engine_id, l.state, e.reason, e.actor FROM leases l LEFT JOIN lease_events e "
                "ON e.lease_id = l.lease_id AND e.to_state = 'INVALIDATED' WHERE l.lease_id = ANY($1::uuid[])",
                list(leases.values()),
            )
            got = {r["engine_id"]: (r["state"], r["reason"], r["actor"]) for r in rows}
            if got[silent][0] == "INVALIDATED" and got[restarted][0] == "INVALIDATED":
                break
            await asyncio.sleep(0.1)
    assert got[bumped] == ("INVALIDATED", "GENERATION_ADVANCED", "registry")
    assert got[restarted] == ("INVALIDATED", "GENERATION_ADVANCED", "reaper:reaper-a")
    assert got[silent] == ("INVALIDATED", "HEARTBEAT_TIMEOUT", "reaper:reaper-a")
    assert got[healthy] == ("RETAINED", None, None)
    status_of = dict(await db.fetch("SELECT engine_id, status FROM engines WHERE engine_id = ANY($1)", [silent, healthy]))
    assert status_of == {silent: "DEAD", healthy: "ACTIVE"}


async def record_history(db: asyncpg.Connection, tenant: str) -> None:
    """Nineteen turns whose next turn claimed them after 5, 10, …, 95 s, one whose lease
    expired and whose next turn ended 200 s later, and each conversation's last turn."""
    engine_id = f"d-{uuid.uuid4().hex[:8]}"
    await db.execute(
        "INSERT INTO engines (engine_id, role, model, generation, kv_blocks_ttl_seconds, block_size, bytes_per_block, status) "
        "VALUES ($1, 'DECODE', 'm-advice', 1, 480, 16, 1048576, 'DEAD')",
        engine_id,
    )
    base = datetime.now(UTC) - timedelta(hours=2)
    pauses = [(5.0 * k, True) for k in range(1, 20)] + [(200.0, False)]
    for i, (pause, claimed) in enumerate(pauses):
        conv = f"conv-{i}"
        first, second = base + timedelta(minutes=i), base + timedelta(minutes=i, seconds=pause)
        for n, (finished, state) in enumerate([(first, "CONSUMED" if claimed else "EXPIRED"), (second, "EXPIRED")]):
            lease_id = uuid.uuid4()
            await db.execute(
                "INSERT INTO leases (lease_id, tenant, conversation_id, model, engine_id, engine_generation, "
                "remote_request_id, block_ids, num_blocks, num_tokens, block_size, chain, tail_hash, remote_host, "
                "remote_port, tp_size, dcp_size, pp_size, state, finished_at, created_at, expires_at) VALUES "
                "($1, $2, $3, 'm-advice', $4, 1, $5, '[[1, 2]]', 2, 32, 16, ''::bytea, ''::bytea, 'h', 1, 1, 1, 1, "
                "$6, $7, $7, $7::timestamptz + interval '480 s')",
                lease_id, tenant, conv, engine_id, f"req-{i}-{n}", state, finished,
            )
            await db.execute(
                "INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason, actor, created_at) "
                "VALUES ($1, $2, $3, NULL, 'RETAINED', 'REGISTERED', 'registry', $4)",
                lease_id, tenant, conv, finished,
            )
            if n == 0 and claimed:
                await db.execute(
                    "INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason, actor, "
                    "claim_id, created_at) VALUES ($1, $2, $3, 'RETAINED', 'CLAIMED', 'CLAIMED', 'registry', 'c', $4)",
                    lease_id, tenant, conv, second,
                )


def advise_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BOOMERANG, "advise-ttl", *args], capture_output=True, text=True, timeout=60)


async def test_advise_ttl_on_a_recorded_history(reapers: dict[str, ServiceProcess], db: asyncpg.Connection) -> None:
    tenant = f"advice-{uuid.uuid4().hex[:6]}"
    await record_history(db, tenant)
    common = ["--tenant", tenant, "--safety-seconds", "0", "--history-hours", "3"]
    # Pauses (s): 5, 10, …, 95 and 200. Linear percentiles: p50 = 52.5, p90 = 90.5,
    # p95 = 95 + 0.05 × 105, p99 = 95 + 0.81 × 105, max 200. 95 % of 20 pauses is 19: the
    # 19th shortest is 95 s, so the shortest TTL is 96 s (a pause must be shorter than it).
    expected = {"p50": 52.5, "p90": 90.5, "p95": 100.25, "p99": 180.05, "max": 200.0}
    outputs = []
    # Either replica answers (a standby too): each reads the history from the registry.
    for reaper in ("a", "b"):
        done = await asyncio.to_thread(advise_cli, *common, "--reaper", reapers[reaper].address, "--json")
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    for doc in outputs:
        (entry,) = doc["advice"]
        assert (entry["tenant"], entry["model"]) == (tenant, "m-advice")
        assert (entry["turns"], entry["next_turns"], entry["exact_pauses"]) == (40, 20, 19)
        assert entry["pause_seconds"] == pytest.approx(expected)
        assert entry["recommended_ttl_seconds"] == 96 and entry["current_ttl_seconds"] == 480
        rec = next(c for c in entry["candidates"] if c["recommended"])
        assert rec["reuse_share"] == 0.95 and rec["ttl_seconds"] == 96
        assert entry["bytes_known_share"] == 1.0
    stricter = await asyncio.to_thread(advise_cli, *common, "--reaper", reapers["b"].address, "--target", "0.9", "--json")
    assert json.loads(stricter.stdout)["advice"][0]["recommended_ttl_seconds"] == 91
    table = await asyncio.to_thread(advise_cli, *common, "--reaper", reapers["a"].address)
    assert table.returncode == 0, table.stderr
    assert "recommendation: decoder_kv_blocks_ttl = 96 s (95.0% of next turns" in table.stdout
    assert "p50 52.5 s" in table.stdout and "vs the current 480 s" in table.stdout
    bad = await asyncio.to_thread(advise_cli, "--reaper", reapers["a"].address, "--target", "2")
    # One line (issue 26): who refused, what, and the fix.
    assert bad.returncode == 1 and bad.stderr.strip() == (
        f"boomerang advise-ttl: the reaper at {reapers['a'].address} rejected AdviseTTL: "
        "target_reuse: must be above 0 and at most 1 (0: default 0.95); fix that value"), bad.stderr


async def test_fenced_registry_rpcs_name_every_bad_field(registry: ServiceProcess) -> None:
    async with ReaperRegistryClient(registry.address) as c:
        calls = [
            (c.expire_leases(rpb.ExpireLeasesRequest(max_leases=10_001, actor="a b")), {"fence", "max_leases", "actor"}),
            (c.sweep_engines(rpb.SweepEnginesRequest(fence=rpb.ReaperFence(term=0), heartbeat_timeout_seconds=-1,
                                                     request_id="x" * 200)),
             {"fence.term", "heartbeat_timeout_seconds", "request_id"}),
            (c.enforce_event_retention(rpb.EnforceEventRetentionRequest(
                fence=rpb.ReaperFence(election="bad election", term=1), retention_days=4000, days_ahead=61)),
             {"fence.election", "retention_days", "days_ahead"}),
            (unary("ListRegistrations", c.stub.ListRegistrations, rpb.ListRegistrationsRequest(
                tenant="a b", history_hours=0, page_size=10_001, page_token="x"), 5.0),
             {"tenant", "history_hours", "page_size", "page_token"}),
        ]
        for call, fields in calls:
            with pytest.raises(BoomerangClientError) as err:
                await call
            assert err.value.code == "INVALID_ARGUMENT"
            assert {v.field for v in err.value.error.violations} == fields


async def test_registry_drain_ends_deadline_watches_promptly(db_url: str) -> None:
    reg = ServiceProcess(
        ["registry", "--listen", "127.0.0.1:0", "--grace-seconds", "20"],
        {"BOOMERANG_DATABASE_URL": db_url, "BOOMERANG_DRAIN_DELAY_SECONDS": "0.2"},
    ).start()
    try:
        async with ReaperRegistryClient(reg.address) as watcher:
            stream = watcher.watch_lease_deadlines("e2e")
            first = await asyncio.wait_for(stream.__anext__(), 5)
            assert first.snapshot
            started = time.monotonic()
            await asyncio.to_thread(reg.terminate, 30)
            took = time.monotonic() - started
            with pytest.raises(BoomerangClientError) as err:
                await asyncio.wait_for(stream.__anext__(), 5)
            assert err.value.code == "UNAVAILABLE"
        assert took < 5, f"the stream held the registry's stop for {took:.1f}s (grace 20 s)"
    finally:
        reg.kill()


async def test_leader_sigkill_standby_takes_over_no_lease_expired_twice_or_left(
    reapers: dict[str, ServiceProcess], registry: ServiceProcess, client: RegistryClient, db: asyncpg.Connection
) -> None:
    old_term = (await status(reapers["a"])).term
    engine_id = await new_engine(client, ttl=5)
    async with heartbeating(client, {engine_id: 1}):
        now = time.time()
        # Due 0.5 … 4.6 s from now: before the kill, in the leaderless gap, and after takeover.
        ids = [await new_lease(client, engine_id, finish=now - 4.5 + 0.14 * i) for i in range(30)]
        await asyncio.sleep(1.2)
        reapers["a"].kill()  # SIGKILL: no release, no drain
        killed = time.monotonic()
        while not (await status(reapers["b"])).leader:
            assert time.monotonic() - killed < LEASE_SECONDS + 1.0, reapers["b"].output()
            await asyncio.sleep(0.05)
        took = time.monotonic() - killed
        last = await db.fetchval("SELECT max(expires_at) FROM leases WHERE lease_id = ANY($1::uuid[])", ids)
        while await db.fetchval("SELECT now()") < last + timedelta(seconds=1.5):
            await asyncio.sleep(0.1)
    assert took <= LEASE_SECONDS + 0.3, took
    new = await status(reapers["b"])
    assert new.leader and new.term == old_term + 1 and new.backlog_leases == 0
    events = await expiry_events(db, ids)
    assert sorted(e["id"] for e in events) == sorted(ids)  # none left behind, none expired twice
    states = {r["state"] for r in await db.fetch("SELECT state FROM leases WHERE lease_id = ANY($1::uuid[])", ids)}
    assert states == {"EXPIRED"}
    lags = [e["lag"].total_seconds() for e in events]
    assert min(lags) >= 0 and max(lags) <= LEASE_SECONDS + 1.0  # only leases due in the gap waited
    took_over = await db.fetchval("SELECT acquired_at FROM reaper_leader WHERE election = 'ttl-reaper'")
    after = await db.fetch(
        "SELECT e.created_at - l.expires_at AS lag FROM lease_events e JOIN leases l USING (lease_id) "
        "WHERE e.to_state = 'EXPIRED' AND e.lease_id = ANY($1::uuid[]) AND l.expires_at > $2",
        ids, took_over,
    )
    assert after and max(r["lag"].total_seconds() for r in after) <= 1.0
    print(f"\ntakeover {took:.3f}s after SIGKILL; lag max {max(lags):.3f}s over all, "
          f"{max(r['lag'].total_seconds() for r in after):.3f}s for the {len(after)} due after takeover")
    assert {e["actor"] for e in events} <= {"reaper:reaper-a", "reaper:reaper-b"}
    # The dead leader's term is fenced off for good.
    async with ReaperRegistryClient(registry.address) as late:
        with pytest.raises(BoomerangClientError) as err:
            await late.expire_leases(rpb.ExpireLeasesRequest(fence=rpb.ReaperFence(term=old_term)))
    assert err.value.code == "FAILED_PRECONDITION" and err.value.reason == "FENCED"
