"""The failover fence: no lease used on a lost timeline is ever claimed again.

Single use rests on the database remembering every claim. After a failover to an
asynchronous standby that missed the last commits, a lease claimed and consumed on the old
primary is RETAINED again on the new one, and its decode engine has freed the blocks.

Migration 0011's `database_epoch` row holds the (system identifier, timeline) the registry
last fenced on, and every claim and registration statement checks it (statements.EPOCH_GUARD),
raising SQLSTATE BX001 when the server's differs (a promotion starts a new timeline).
Nothing of that statement is applied. The caller (`fenced`) then runs the fence once for
the whole process and repeats its call:

- in one transaction, under the epoch row's lock (so concurrent fences run it once);
- every live lease (RETAINED or CLAIMED) becomes INVALIDATED, its event naming the reason
  (`TIMELINE_CHANGED` or `SYSTEM_CHANGED`) and both epochs; the RETAINED ones are marked
  for release, so their decode engines free the blocks at their next heartbeat (a CLAIMED
  one may be under a pull right now, and is never released under its puller, as at expiry);
- the row takes the server's values and `fenced_at`, from which registrations of turns that
  finished before the fence are refused (`FINISHED_BEFORE_FAILOVER`): such a turn may have
  been registered, pulled and freed on the lost timeline, and a late repeat of its
  registration (a retry, or the gateway's report of a turn the hook already registered)
  would otherwise make it claimable again.

The cost is one missed pull per conversation with a live lease; never a wrong one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.metrics import FENCED_LEASES, FENCES
from boomerang_registry.statements import LIVE_LEASE_FILTER, SERVER_TIMELINE

log = logging.getLogger(__name__)
T = TypeVar("T")

EPOCH_CHANGED_SQLSTATE = "BX001"  # the guard's refusal (boomerang_epoch_changed())

_LOCK_EPOCH_SQL = "SELECT system_identifier, timeline FROM database_epoch FOR UPDATE"
_SERVER_EPOCH_SQL = (
    f"SELECT system_identifier, {SERVER_TIMELINE} AS timeline FROM pg_control_system()"
)
_STORE_EPOCH_SQL = """
INSERT INTO database_epoch (system_identifier, timeline, fenced_at)
VALUES (:system_identifier, :timeline, now())
ON CONFLICT (singleton) DO UPDATE SET system_identifier = EXCLUDED.system_identifier,
    timeline = EXCLUDED.timeline, fenced_at = now(), updated_at = now()
"""
# Every live lease of every tenant to INVALIDATED, one event each with both epochs; the
# unclaimed ones marked for release (SET reads the row before the update).
FENCE_LEASES_SQL = f"""
WITH old AS (
    SELECT lease_id, tenant, conversation_id, state FROM leases WHERE {LIVE_LEASE_FILTER} FOR UPDATE
), moved AS (
    UPDATE leases l SET state = 'INVALIDATED', version = l.version + 1, updated_at = now(),
           release_pending = (l.state = 'RETAINED')
    FROM old WHERE l.tenant = old.tenant AND l.conversation_id = old.conversation_id
      AND l.lease_id = old.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, l.claim_id, old.state AS from_state
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state,
                              reason, actor, request_id, claim_id, details)
    SELECT lease_id, tenant, conversation_id, from_state, 'INVALIDATED', CAST(:reason AS text),
           CAST(:actor AS text), '', COALESCE(claim_id, ''), CAST(:details AS jsonb)
    FROM moved
)
SELECT count(*) AS fenced, count(*) FILTER (WHERE from_state = 'RETAINED') AS released FROM moved
"""


def epoch_changed(exc: BaseException) -> bool:
    """Whether `exc` is the epoch guard's refusal: the server is on a new epoch."""
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate == EPOCH_CHANGED_SQLSTATE


class EpochFence:
    """Runs the fence at most once at a time per process; callers share the running one."""

    def __init__(self, owner: AsyncEngine, actor: str):
        self.owner = owner
        self.actor = actor
        self._running: asyncio.Task[int | None] | None = None

    async def ensure(self) -> int | None:
        """EpochFence if the server's epoch is not the stored one; the leases fenced, or None if
        the epoch was current (another caller or replica fenced first).

        The fence runs in its own task, shielded: a caller whose deadline passes (a claim's
        is 50 ms) does not cancel a fence of many leases half-way, and the next caller
        waits for the same one instead of starting another."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self.run())
        return await asyncio.shield(self._running)

    async def run(self) -> int | None:
        """One fence transaction (see the module's doc); the leases fenced, or None."""
        async with self.owner.begin() as conn:
            stored = (await conn.execute(text(_LOCK_EPOCH_SQL))).mappings().first()
            server = (await conn.execute(text(_SERVER_EPOCH_SQL))).mappings().one()
            if stored is not None and (stored["system_identifier"], stored["timeline"]) == (
                server["system_identifier"], server["timeline"]
            ):
                return None
            before = {"system_identifier": None, "timeline": None} if stored is None else dict(stored)
            reason = "SYSTEM_CHANGED" if before["system_identifier"] != server["system_identifier"] else "TIMELINE_CHANGED"
            details = {
                "from_system_identifier": str(before["system_identifier"]), "from_timeline": before["timeline"],
                "to_system_identifier": str(server["system_identifier"]), "to_timeline": server["timeline"],
            }
            counts = (
                await conn.execute(
                    text(FENCE_LEASES_SQL),
                    {"reason": reason, "actor": self.actor, "details": json.dumps(details)},
                )
            ).mappings().one()
            await conn.execute(text(_STORE_EPOCH_SQL), dict(server))
        log.warning(
            "database epoch changed (%s: system %s timeline %s -> system %s timeline %s): "
            "%d live leases invalidated, %d marked for release",
            reason, before["system_identifier"], before["timeline"], server["system_identifier"],
            server["timeline"], counts["fenced"], counts["released"],
        )
        FENCES.labels(reason).inc()
        FENCED_LEASES.inc(counts["fenced"])
        return int(counts["fenced"])

    async def fenced(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, and once more after the fence when the server's epoch changed under it."""
        try:
            return await call()
        except asyncpg.PostgresError as exc:
            if not epoch_changed(exc):
                raise
        await self.ensure()
        return await call()
