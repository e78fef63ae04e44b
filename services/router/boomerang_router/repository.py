"""The router's SQL edge: `turn_plans`, written off the plan's critical path.

A plan answer never waits for Postgres. Each plan (and later its outcome) is handed to the
`AuditWriter`, which upserts pending rows in batches from a background task. The pending
set is keyed by plan id, so a plan reported before its first row was flushed is written
once, whole. When Postgres refuses a batch, its rows go to the on-disk spool (`spool.py`:
fsync'd, replayed once Postgres answers, also on start) and, for a back-off that grows to
a few seconds, every flush moves the pending rows there without asking Postgres; so memory
stays bounded and an outage loses no row. Only rows that find both the memory queue and
the spool full (or no spool configured) are dropped — logged and counted
(`boomerang_router_audit_rows_dropped_total`, `boomerang_router_audit_spool_full`), never
turned into failed plans. Every write is the upsert keyed by plan id, so a row written
again (a replayed spool) is still one row.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import asyncpg
from boomerang_server.db.models import turn_plans
from prometheus_client import Counter
from sqlalchemy import and_, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_router.domain import PlanDecision, PlanReason
from boomerang_router.plan_store import PlanRecord, plan_time
from boomerang_router.spool import REPLAYED, SET_ASIDE, AuditSpool

log = logging.getLogger(__name__)

ROWS_WRITTEN = Counter("boomerang_router_audit_rows_written", "turn_plans rows upserted")
UNCONFIRMED = Counter(
    "boomerang_router_audit_rows_unconfirmed",
    "Plans and reports answered before their turn_plans row was written (the wait for it ran out)",
)
ROWS_DROPPED = Counter(
    "boomerang_router_audit_rows_dropped", "turn_plans rows given up on (queue full or Postgres failing)"
)

# Columns an outcome fills in; a row written again keeps what is already there unless the
# new row knows better (the plan's own columns never change).
_OUTCOME_COLUMNS = (
    "reported_at",
    "handle_use",
    "claimed_lease_state",
    "retention",
    "new_lease_id",
    "outcome",
    "outcome_detail",
    "delivered_cached_tokens",
)


# The record's fields a column stores under another name, and the text columns that hold
# NULL where the record holds "".
_COLUMN_FIELD = {"reused_tokens": "reusable_tokens", "recomputed_tokens": "recompute_tokens"}
_NULL_IF_EMPTY = (
    "source_engine_id",
    "lease_id",
    "claim_id",
    "handle_use",
    "claimed_lease_state",
    "retention",
    "new_lease_id",
    "outcome",
    "outcome_detail",
)


def to_row(r: PlanRecord) -> dict[str, Any]:
    """The `turn_plans` row of a plan record."""
    row = {column: getattr(r, _COLUMN_FIELD.get(column, column)) for column in _COLUMNS}
    row.update({column: row[column] or None for column in _NULL_IF_EMPTY})
    row.update(decision=r.decision.value, reason=r.reason.value)
    row.update(plan_micros=min(r.plan_micros, 2**31 - 1))
    return row


def from_row(row: Mapping[Any, Any]) -> PlanRecord:
    """A plan record from a `turn_plans` row (its UUID columns as text)."""
    values = {_COLUMN_FIELD.get(column, column): row[column] for column in _COLUMNS}
    values.update({column: str(row[column] or "") for column in _NULL_IF_EMPTY})
    values.update(plan_id=str(row["plan_id"]), decision=PlanDecision(row["decision"]))
    values.update(reason=PlanReason(row["reason"]))
    return PlanRecord(**values)


_PG_TYPES = {"UUID": "uuid", "DateTime": "timestamptz", "BigInteger": "bigint", "Integer": "integer", "Text": "text"}


def _pg_type(column: Any) -> str:
    return _PG_TYPES[type(column.type).__name__]


# One statement per batch, its rows passed as one array per column: asyncpg encodes the
# arrays in C, so a 500-row batch costs the event loop a few milliseconds, not fifty.
_COLUMNS = [c.name for c in turn_plans.columns]
UPSERT_SQL = (
    f"INSERT INTO turn_plans ({', '.join(_COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'${i + 1}::{_pg_type(c)}[]' for i, c in enumerate(turn_plans.columns))}) "
    "ON CONFLICT (plan_id, created_at) DO UPDATE SET "
    + ", ".join(f"{name} = COALESCE(EXCLUDED.{name}, turn_plans.{name})" for name in _OUTCOME_COLUMNS)
)


# ListTurnPlans' page: the keyset (created_at, plan_id) after the previous page's last plan,
# read in ix_turn_plans_conversation's order (tests/integration/test_router_list_plans_sql.py).
CONVERSATION_PAGE_SQL = """
SELECT * FROM turn_plans
WHERE tenant = :tenant AND conversation_id = :conversation
  AND (created_at, plan_id) > (:after_created, CAST(:after_id AS uuid))
ORDER BY created_at, plan_id LIMIT :limit
"""
_BEFORE_ANY, _NIL = datetime(1, 1, 1, tzinfo=UTC), "00000000-0000-0000-0000-000000000000"


class TurnPlanRepository:
    """Reads and writes of `turn_plans`; every read is scoped to one tenant."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def upsert(self, rows: list[dict[str, Any]]) -> None:
        """Write plan rows (insert, or fill in their outcome) in one statement."""
        if not rows:
            return
        arrays = [[row.get(name) for row in rows] for name in _COLUMNS]  # a spooled row may predate a column
        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            await raw.driver_connection.execute(UPSERT_SQL, *arrays)  # type: ignore[union-attr]

    async def get(self, tenant: str, plan_id: str, created_at: datetime) -> PlanRecord | None:
        """One tenant's plan by id (`created_at` comes from the id and selects the partition)."""
        query = select(turn_plans).where(
            and_(
                turn_plans.c.plan_id == plan_id,
                turn_plans.c.created_at == created_at,
                turn_plans.c.tenant == tenant,
            )
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else from_row(row._mapping)

    async def conversation_page(
        self, tenant: str, conversation_id: str, after: str, limit: int
    ) -> list[PlanRecord]:
        """Up to `limit` of a conversation's plans, oldest first, after the plan id `after` ("": from the first)."""
        start = (plan_time(after), after) if after else (_BEFORE_ANY, _NIL)
        params = {"tenant": tenant, "conversation": conversation_id, "after_created": start[0],
                  "after_id": start[1], "limit": limit}
        async with self.engine.connect() as conn:
            rows = await conn.execute(text(CONVERSATION_PAGE_SQL), params)
            return [from_row(r._mapping) for r in rows]

    async def claim_handed_out(self, tenant: str, conversation_id: str, claim_id: str, since: datetime) -> bool:
        """Whether a recorded PULL plan of the conversation (made after `since`) holds `claim_id`."""
        query = select(turn_plans.c.plan_id).where(
            and_(
                turn_plans.c.tenant == tenant,
                turn_plans.c.conversation_id == conversation_id,
                turn_plans.c.created_at >= since,
                turn_plans.c.claim_id == claim_id,
                turn_plans.c.decision == "PULL",
            )
        ).limit(1)
        async with self.engine.connect() as conn:
            return (await conn.execute(query)).first() is not None

    async def ensure_partitions(self) -> int:
        """Create the daily partitions around today (idempotent)."""
        async with self.engine.begin() as conn:
            made = await conn.execute(text("SELECT boomerang_ensure_turn_plan_partitions(1, 7)"))
            return int(made.scalar_one())


PARTITION_SECONDS = 3600.0  # how often the writer creates the coming days' partitions
MAX_BACKOFF_SECONDS = 2.0  # the longest a failing Postgres is left alone
# SQLSTATE classes of a Postgres that cannot take rows now (connection, shutdown, resources).
_TRANSIENT_SQLSTATES = ("08", "53", "57")


def _merged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per plan (a plan spooled, then its outcome): what a later row knows wins, as
    in the upsert (which cannot touch a row twice in one statement)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = str(row["plan_id"])
        if key in out:
            out[key].update({k: v for k, v in row.items() if v is not None})
        else:
            out[key] = dict(row)
    return list(out.values())


class AuditWriter:
    """Batches `turn_plans` rows to Postgres from a background task.

    `kept(plan_id)` waits until a plan's queued row has left memory: written to Postgres, or
    (Postgres failing) appended to the fsync'd spool, or dropped and counted. PlanTurn and
    ReportTurn answer only after it, so a router SIGKILLed right after an answer loses no
    row. Waiting wakes the writer at once; the rows queued meanwhile share one INSERT and one
    commit (a group commit), so concurrent plans pay one round trip between them.
    """

    def __init__(
        self,
        repo: TurnPlanRepository,
        flush_interval: float = 0.1,
        batch_size: int = 500,
        max_pending: int = 100_000,
        attempts: int = 3,
        spool: AuditSpool | None = None,
    ):
        self.repo = repo
        self.spool = spool
        self._backoff = 0.0  # seconds; 0 while Postgres takes the rows
        self._down_until = 0.0  # loop time before which flushes spool without asking Postgres
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.max_pending = max_pending
        self.attempts = attempts
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}  # plan id → kept() calls of its pending row
        self._writing_rows: dict[str, dict[str, Any]] = {}  # the batch Postgres is being asked to take
        self.written = 0
        self.dropped = 0
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()  # one batch at a time, so flush() also waits for it
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def submit(self, record: PlanRecord) -> bool:
        """Queue a plan's row (replacing any unwritten older row of it); False if dropped."""
        key = record.plan_id
        if key not in self.pending and len(self.pending) >= self.max_pending:
            self._drop(1, "the audit queue is full")
            return False
        self.pending[key] = to_row(record)
        if len(self.pending) >= self.batch_size:
            self._wake.set()
        return True

    async def kept(self, plan_id: str, timeout: float) -> bool:
        """Wait (at most `timeout` s) until the plan's row is out of memory; whether it is.

        True at once when nothing of the plan is queued or being written (written already, or
        never submitted). Past `timeout`, a row still in memory (queued, or in a batch Postgres
        has not answered: a failover, a synchronous standby gone) goes to the spool now, so an
        answer never leaves a row that a SIGKILL would lose. The batch may still write it too:
        the upsert makes that one row.
        """
        if plan_id not in self.pending and plan_id not in self._writing_rows:
            return True
        if self._task is not None and timeout > 0:
            done = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(plan_id, []).append(done)
            self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout)
                return True
            except TimeoutError:
                pass
        UNCONFIRMED.inc()
        row = self.pending.get(plan_id) or self._writing_rows.get(plan_id)
        if row is None:  # written while the wait ended
            return True
        if await self._to_spool([row]) == 1:
            return True
        # The audit never fails a plan: the row stays queued for Postgres, the answer goes.
        log.warning("plan %s answered before its turn_plans row was written or spooled (%.1f s)", plan_id, timeout)
        return False

    def _take(self, keys: list[str]) -> tuple[list[dict[str, Any]], dict[str, list[asyncio.Future[None]]]]:
        """Rows leaving the queue, and the `kept` waits they end once written, spooled or dropped."""
        rows = [self.pending.pop(k) for k in keys]
        return rows, {k: self._waiters.pop(k) for k in keys if k in self._waiters}

    def start(self) -> None:
        """Start the background flusher."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="turn-plans-writer")

    async def stop(self, timeout: float = 5.0) -> None:
        """Flush what is pending (for at most `timeout` seconds) and stop."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None
        if self.pending:
            await self._spill_queued("the router stopped before they were written")
        if self.spool is not None:
            await asyncio.to_thread(self.spool.close)

    async def flush(self) -> None:
        """Write everything pending now, including a batch the background task is writing.

        While Postgres is backed off (it refused the last batch), the pending rows go to the
        spool instead; once it answers, what the spool holds is replayed.
        """
        async with self._writing:
            if self._backing_off():
                await self._spill_queued("Postgres is failing")
                return
            while self.pending:
                if not await self._flush_batch():
                    return
            if self.spool is not None and await asyncio.to_thread(self.spool.pending):
                await self._replay()

    def _backing_off(self) -> bool:
        return self.spool is not None and not self._stopping and asyncio.get_running_loop().time() < self._down_until

    def _refused(self) -> None:
        self._backoff = min(MAX_BACKOFF_SECONDS, max(self.flush_interval, self._backoff * 2))
        self._down_until = asyncio.get_running_loop().time() + self._backoff

    async def _replay(self) -> None:
        """Write spooled segments (oldest first) and delete each once all of it is written."""
        assert self.spool is not None
        while True:
            segment = await asyncio.to_thread(self.spool.take)
            if segment is None:
                return
            written = False
            try:
                rows = _merged(await asyncio.to_thread(segment.read_all))
                for i in range(0, len(rows), self.batch_size):
                    await self.repo.upsert(rows[i : i + self.batch_size])
                written = True
                self.written += len(rows)
                ROWS_WRITTEN.inc(len(rows))
                REPLAYED.inc(len(rows))
                log.info("wrote %d spooled turn_plans row(s) from %s", len(rows), segment.path.name)
            except asyncpg.PostgresError as exc:
                if str(exc.sqlstate or "").startswith(_TRANSIENT_SQLSTATES):
                    log.warning("replaying the audit spool failed (kept for later): %s", exc)
                    self._refused()
                    return
                # Postgres answers and refuses these rows (no partition for their day, …):
                # set the segment aside for an operator instead of retrying it forever.
                kept = await asyncio.to_thread(self.spool.set_aside, segment)
                log.error("audit spool segment %s refused by Postgres (%s: %s); kept as %s for an operator",
                          segment.path.name, exc.__class__.__name__, exc, kept)
                SET_ASIDE.inc()
                continue
            except Exception as exc:  # noqa: BLE001 - kept on disk for the next try
                log.warning("replaying the audit spool failed (kept for later): %s: %s", exc.__class__.__name__, exc)
                self._refused()
                return
            finally:
                await asyncio.to_thread(self.spool.done, segment, written)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_partitions = loop.time() + PARTITION_SECONDS
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()
            if loop.time() >= next_partitions:
                next_partitions = loop.time() + PARTITION_SECONDS
                try:
                    await self.repo.ensure_partitions()
                except Exception:
                    log.warning("could not create turn_plans partitions", exc_info=True)
        await self.flush()

    async def _flush_batch(self) -> bool:
        keys = list(self.pending)[: self.batch_size]
        rows, waits = self._take(keys)
        self._writing_rows = dict(zip(keys, rows, strict=True))
        try:
            for attempt in range(1, self.attempts + 1):
                try:
                    await self.repo.upsert(rows)
                except asyncio.CancelledError:
                    for key, row in zip(keys, rows, strict=True):  # cut off (a stop's deadline): keep them for the spool
                        self.pending.setdefault(key, row)
                    for key, kept in waits.items():  # their waits go on, for the spool
                        self._waiters.setdefault(key, []).extend(kept)
                    waits = {}
                    raise
                except Exception as exc:  # noqa: BLE001 - the audit must never fail a plan
                    if attempt == self.attempts or self.spool is not None:
                        self._refused()
                        await self._spill(rows, f"Postgres refused them: {exc.__class__.__name__}: {exc}")
                        return False
                    await asyncio.sleep(0.05 if self._stopping else min(1.0, self.flush_interval * 2**attempt))
                else:
                    self._backoff = 0.0
                    self.written += len(rows)
                    ROWS_WRITTEN.inc(len(rows))
                    return True
            return False
        finally:
            self._writing_rows = {}
            _end(waits)  # written, spooled or dropped: out of memory either way

    async def _spill_queued(self, why: str) -> None:
        """Every queued row to the spool (or dropped), and their `kept` waits ended."""
        rows, waits = self._take(list(self.pending))
        await self._spill(rows, why)
        _end(waits)

    async def _spill(self, rows: list[dict[str, Any]], why: str) -> None:
        """Rows Postgres cannot take now: to the spool, or (none, or full) dropped."""
        if not rows:
            return
        kept = await self._to_spool(rows)
        if kept < len(rows):
            full = " and the audit spool is full" if self.spool is not None else ""
            self._drop(len(rows) - kept, why + full)

    async def _to_spool(self, rows: list[dict[str, Any]]) -> int:
        """Append rows to the spool; how many it kept (0 without a spool, or when it cannot be
        written; fewer when full)."""
        if self.spool is None:
            return 0
        try:
            return await asyncio.to_thread(self.spool.append, rows)
        except OSError as exc:
            log.error("cannot write the audit spool in %s: %s", self.spool.directory, exc)
            return 0

    def _drop(self, count: int, why: str) -> None:
        self.dropped += count
        ROWS_DROPPED.inc(count)
        log.error("dropped %d turn_plans audit row(s): %s", count, why[:500])


def _end(waits: dict[str, list[asyncio.Future[None]]]) -> None:
    for kept in waits.values():
        for wait in kept:
            if not wait.done():
                wait.set_result(None)
