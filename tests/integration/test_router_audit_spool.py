"""No audit row lost (issue 15, point 3): rows Postgres cannot take go to the on-disk spool
and are written, once each, when it answers — also by a router started afterwards.

"Postgres down" is a URL nobody listens on; "back" is the session's real test database.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from boomerang_router.domain import PlanDecision, PlanReason
from boomerang_router.plan_store import PlanRecord, new_plan_id, plan_time
from boomerang_router.repository import (
    _COLUMNS,
    UPSERT_SQL,
    AuditWriter,
    TurnPlanRepository,
    to_row,
)
from boomerang_router.spool import SET_ASIDE, SPOOL_FULL, SUFFIX, AuditSpool
from boomerang_server.db import make_engine

pytestmark = pytest.mark.integration


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/nothing"


def _record(tenant: str, n: int) -> PlanRecord:
    pid = new_plan_id()
    return PlanRecord(pid, plan_time(pid), tenant, f"conv-{n % 3}", "m", f"req-{n}", PlanDecision.COLD,
                      PlanReason.NO_LEASE, "p", "http://p", "d", "http://d", 100 + n, 0, 100 + n, 0, 64,
                      router="spool-test")


async def _rows(pg: asyncpg.Connection, tenant: str) -> list[asyncpg.Record]:
    return await pg.fetch("SELECT plan_id::text AS plan_id, outcome, prompt_tokens FROM turn_plans WHERE tenant = $1",
                          tenant)


async def _until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_an_outage_spools_every_row_and_a_restarted_writer_writes_each_once(
    database_url: str, pg: asyncpg.Connection, unique: str, tmp_path: Path
) -> None:
    tenant = f"spool-{unique}"
    spool_dir = tmp_path / "spool"
    records = [_record(tenant, n) for n in range(40)]

    # Postgres down: every row and every outcome reaches the spool; nothing is dropped.
    down_engine = make_engine(_dead_url(), 2)
    down = AuditWriter(TurnPlanRepository(down_engine), flush_interval=0.02, batch_size=16,
                       spool=AuditSpool(spool_dir, 1 << 20, "a"))
    down.start()
    for r in records:
        down.submit(r)
    await asyncio.sleep(0.1)
    for r in records[::2]:  # half of them are reported during the outage
        r.reported_at, r.outcome = datetime.now(UTC), "COMPLETED"
        down.submit(r)
    await down.stop(3.0)
    await down_engine.dispose()
    assert down.dropped == 0 and down.written == 0
    segments = sorted(spool_dir.glob(f"*{SUFFIX}"))
    assert segments and await _rows(pg, tenant) == []
    kept = tmp_path / "copy"
    kept.mkdir()
    for seg in segments:
        shutil.copy(seg, kept / seg.name)

    # A writer started afterwards (a restarted router) replays the spool on its own.
    engine = make_engine(database_url, 2)
    up = AuditWriter(TurnPlanRepository(engine), flush_interval=0.02, spool=AuditSpool(spool_dir, 1 << 20, "b"))
    up.start()
    try:
        async def all_written() -> bool:
            return len(await _rows(pg, tenant)) == len(records) and not list(spool_dir.glob(f"*{SUFFIX}"))

        await _until(all_written)
        rows = {r["plan_id"]: r for r in await _rows(pg, tenant)}
        assert set(rows) == {r.plan_id for r in records}
        assert {pid for pid, r in rows.items() if r["outcome"] == "COMPLETED"} == {r.plan_id for r in records[::2]}

        # The same segments replayed again (a crash between writing and deleting): still one row each.
        for seg in kept.iterdir():
            shutil.copy(seg, spool_dir / seg.name)
        await _until(lambda: asyncio.sleep(0, not list(spool_dir.glob(f"*{SUFFIX}"))))
        counts = await pg.fetch("SELECT plan_id, count(*) AS n FROM turn_plans WHERE tenant = $1 GROUP BY plan_id",
                                tenant)
        assert len(counts) == len(records) and {c["n"] for c in counts} == {1}
        assert {r["outcome"] for r in await _rows(pg, tenant) if r["plan_id"] in {x.plan_id for x in records[::2]}} \
            == {"COMPLETED"}
    finally:
        await up.stop(3.0)
        await engine.dispose()


async def test_a_full_spool_drops_and_says_so(tmp_path: Path, unique: str) -> None:
    engine = make_engine(_dead_url(), 2)
    writer = AuditWriter(TurnPlanRepository(engine), flush_interval=0.02, spool=AuditSpool(tmp_path, 4096, "full"))
    writer.start()
    try:
        for n in range(30):  # about 700 bytes a row: a 4 KiB spool keeps five
            writer.submit(_record(f"full-{unique}", n))
        await _until(lambda: asyncio.sleep(0, writer.dropped > 0 and not writer.pending))
        assert 0 < writer.spool.bytes <= 4096 and writer.spool.refused == writer.dropped  # type: ignore[union-attr]
        assert SPOOL_FULL._value.get() == 1  # type: ignore[attr-defined]
    finally:
        await writer.stop(2.0)
        await engine.dispose()


def test_two_writers_never_share_a_segment_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    a, b = AuditSpool(tmp_path, 1 << 20, "a"), AuditSpool(tmp_path, 1 << 20, "b")
    row = {"plan_id": new_plan_id(), "created_at": datetime.now(UTC), "tenant": "t", "reported_at": None}
    assert a.append([row]) == 1
    assert b.take() is None  # a still appends to its segment: locked
    a.rotate()
    taken = b.take()
    assert taken is not None and a.take() is None  # b replays it: locked for a
    with open(taken.path, "ab") as f:
        f.write(b'{"plan_id": "torn')  # a crash mid-append
    (back,) = taken.read_all()
    assert back == row
    b.done(taken, written=True)
    assert not list(tmp_path.glob(f"*{SUFFIX}"))


async def test_a_segment_postgres_refuses_is_set_aside_and_the_rest_still_written(
    database_url: str, pg: asyncpg.Connection, unique: str, tmp_path: Path
) -> None:
    tenant = f"aside-{unique}"
    spool = AuditSpool(tmp_path, 1 << 20, "x")
    old, good = _record(tenant, 1), _record(tenant, 2)
    from boomerang_router.repository import to_row

    bad = to_row(old)
    bad["decision"] = "MAYBE"  # a row Postgres refuses (ck_turn_plans_decision) though it is up
    spool.append([bad])
    spool.rotate()
    spool.append([to_row(good)])
    engine = make_engine(database_url, 2)
    writer = AuditWriter(TurnPlanRepository(engine), flush_interval=0.02, spool=spool)
    writer.start()
    try:
        async def settled() -> bool:
            return not list(tmp_path.glob(f"*{SUFFIX}"))

        await _until(settled)
        assert [r["plan_id"] for r in await _rows(pg, tenant)] == [good.plan_id]
        (aside,) = tmp_path.glob("*.refused")
        assert old.plan_id in aside.read_text()  # kept for an operator, not lost
        assert SET_ASIDE._value.get() >= 1  # type: ignore[attr-defined]
    finally:
        await writer.stop(2.0)
        await engine.dispose()


async def test_answers_wait_for_their_rows_and_share_one_commit(database_url: str, pg: asyncpg.Connection,
                                                                 unique: str, tmp_path: Path) -> None:
    """`kept` returns once the row is in Postgres; rows waited for together go in one INSERT."""
    tenant = f"kept-{unique}"
    engine = make_engine(database_url, 2)
    repo = TurnPlanRepository(engine)
    upserts: list[int] = []
    real_upsert = repo.upsert

    async def counted(rows: list[dict[str, object]]) -> None:
        upserts.append(len(rows))
        await real_upsert(rows)

    repo.upsert = counted  # type: ignore[method-assign]
    writer = AuditWriter(repo, flush_interval=60)  # no timed flush: only the waits write
    writer.start()
    try:
        records = [_record(tenant, n) for n in range(20)]
        for r in records:
            writer.submit(r)
        kept = await asyncio.gather(*(writer.kept(r.plan_id, 5.0) for r in records))
        assert all(kept)
        assert {r["plan_id"] for r in await _rows(pg, tenant)} == {r.plan_id for r in records}
        assert upserts == [20], upserts  # one group commit for the twenty
        # A row written already, or never queued, is kept at once.
        assert await writer.kept(records[0].plan_id, 5.0) and await writer.kept(new_plan_id(), 5.0)
    finally:
        await writer.stop()
        await engine.dispose()

    # Postgres down: the wait ends once the row is in the fsync'd spool.
    down_engine = make_engine(_dead_url(), 2)
    spool_dir = tmp_path / "spool"
    down = AuditWriter(TurnPlanRepository(down_engine), flush_interval=60, spool=AuditSpool(spool_dir, 1 << 20, "k"))
    down.start()
    try:
        record = _record(tenant, 99)
        down.submit(record)
        assert await down.kept(record.plan_id, 10.0)
        assert record.plan_id.encode() in b"".join(p.read_bytes() for p in spool_dir.rglob(f"*{SUFFIX}"))
    finally:
        await down.stop(3.0)
        await down_engine.dispose()



async def test_a_row_postgres_does_not_answer_for_is_spooled_before_the_answer(
    database_url: str, pg: asyncpg.Connection, unique: str, tmp_path: Path
) -> None:
    """A batch Postgres holds (here: behind a row lock, as behind a synchronous standby that
    went away) must not leave an answered plan in memory only: past the wait it is spooled."""
    tenant = f"held-{unique}"
    engine = make_engine(database_url, 2)
    spool_dir = tmp_path / "spool"
    writer = AuditWriter(TurnPlanRepository(engine), flush_interval=60, spool=AuditSpool(spool_dir, 1 << 20, "h"))
    record = _record(tenant, 7)
    blocker = await asyncpg.connect(database_url)
    holding = blocker.transaction()
    await holding.start()
    # The same plan id inserted and not committed: the writer's upsert waits on its lock.
    await blocker.execute(UPSERT_SQL, *([to_row(record).get(c)] for c in _COLUMNS))
    writer.start()
    try:
        writer.submit(record)
        assert await writer.kept(record.plan_id, 0.3)  # not written: spooled
        assert record.plan_id in writer._writing_rows  # the upsert is still waiting on the lock
        spooled = b"".join(p.read_bytes() for p in spool_dir.rglob(f"*{SUFFIX}"))
        assert record.plan_id.encode() in spooled
        # A deadline already past spools at once, without waiting.
        late = _record(tenant, 8)
        writer.submit(late)
        assert await writer.kept(late.plan_id, 0.0)
        assert late.plan_id.encode() in b"".join(p.read_bytes() for p in spool_dir.rglob(f"*{SUFFIX}"))
        # A spool that cannot be written fails no plan: the answer goes, unconfirmed.
        assert writer.spool is not None
        unwritable = _record(tenant, 9)
        writer.submit(unwritable)

        def broken(rows: list[dict[str, object]]) -> int:
            raise OSError("disk full")

        writer.spool.append = broken  # type: ignore[method-assign]
        assert not await writer.kept(unwritable.plan_id, 0.0)
    finally:
        await holding.rollback()
        await blocker.close()
        await writer.stop(5.0)
        await engine.dispose()
    # Once Postgres answers, each row is in turn_plans once (the batch, the spool replayed).
    rows = await _rows(pg, tenant)
    assert sorted(r["plan_id"] for r in rows) == sorted([record.plan_id, late.plan_id, unwritable.plan_id])
