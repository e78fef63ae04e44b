"""The registry's Prometheus metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from boomerang_server.leases import ALL_STATES
from boomerang_server.rpc.server import LATENCY_BUCKETS
from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

CLAIMS = Counter("boomerang_registry_claims_total", "ClaimReuse calls by outcome.", ["outcome"])
CLAIM_SECONDS = Histogram(
    "boomerang_registry_claim_seconds", "ClaimReuse latency inside the registry.", buckets=LATENCY_BUCKETS
)
CLAIM_BATCH_SIZE = Histogram(
    "boomerang_registry_claim_batch_size",
    "Claims per ClaimReuseBatch call.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
CLAIMED_TOKENS = Counter("boomerang_registry_claimed_tokens_total", "Verified reusable tokens handed out.")
REGISTRATIONS = Counter(
    "boomerang_registry_registrations_total", "RegisterRetainedBlocks calls by result.", ["result"]
)
BATCH_SIZE = Histogram(
    "boomerang_registry_registration_batch_size",
    "Registrations committed per group-commit transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
TRANSITIONS = Counter(
    "boomerang_registry_lease_transitions_total", "Lease state changes by target state.", ["to_state"]
)
FENCES = Counter(
    "boomerang_registry_fences_total",
    "Failover fences run: the database's timeline (or system identifier) changed, every live lease invalidated.",
    ["reason"],
)
FENCED_LEASES = Counter(
    "boomerang_registry_fenced_leases_total", "Live leases invalidated by failover fences."
)
RELEASES = Counter(
    "boomerang_registry_releases_total",
    "Leases whose blocks a decode engine was told to free (in a heartbeat's answer), by the lease's state.",
    ["reason"],
)
LIVE_LEASES = Gauge("boomerang_leases", "Leases by state (live states and today's ended ones).", ["state"])
RETAINED_BLOCKS = Gauge(
    "boomerang_retained_blocks", "KV blocks held by live leases, per decode engine.", ["engine_id"]
)
RETAINED_BYTES = Gauge(
    "boomerang_retained_bytes",
    "Accelerator memory held by live leases, per decode engine (engines that report bytes per block).",
    ["engine_id"],
)
RETAINED_BLOCK_SECONDS = Counter(
    "boomerang_retained_block_seconds",
    "KV block-seconds held by live leases, per decode engine: the retained-block gauge integrated over "
    "time between refreshes (every registry replica counts the same; take max by engine_id).",
    ["engine_id"],
)


class BlockSecondsMeter:
    """Integrates each engine's retained blocks over time (the trapezoid between two refreshes).

    Block-seconds are what holding decode memory costs; the gauge alone shows only the level
    at each refresh, so a release policy's effect is read from this counter's rate.
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.at: float | None = None

    def advance(self, blocks: dict[str, int], now: float) -> dict[str, float]:
        """Block-seconds per engine since the previous call (none on the first)."""
        added: dict[str, float] = {}
        if self.at is not None and now > self.at:
            dt = now - self.at
            for engine_id in set(blocks) | set(self.last):
                held = (self.last.get(engine_id, 0) + blocks.get(engine_id, 0)) / 2 * dt
                if held > 0:
                    added[engine_id] = held
        self.last, self.at = dict(blocks), now
        return added


_METER = BlockSecondsMeter()


async def refresh_gauges(engine: AsyncEngine, retained: Callable[[], Awaitable[dict[str, int]]]) -> None:
    """Read lease counts and retained memory from Postgres into the gauges.

    Per-engine blocks come from `retained`, the registry's shared `RetainedTotals.get` (one
    scan of live leases serves ListEngines, Heartbeat and these gauges).
    """
    blocks = await retained()
    async with engine.connect() as conn:
        counts: dict[str, int] = dict(
            (
                await conn.execute(
                    text(
                        "SELECT state, count(*) FROM leases WHERE state IN ('RETAINED', 'CLAIMED') "
                        "OR updated_at > now() - interval '1 day' GROUP BY state"
                    )
                )
            ).all()
        )
        decode_engines = (
            await conn.execute(text("SELECT engine_id, bytes_per_block FROM engines WHERE role = 'DECODE'"))
        ).all()
    for state in ALL_STATES:
        LIVE_LEASES.labels(state).set(counts.get(state, 0))
    for engine_id, seconds in _METER.advance(blocks, time.monotonic()).items():
        RETAINED_BLOCK_SECONDS.labels(engine_id).inc(seconds)
    for engine_id, bytes_per_block in decode_engines:
        held = blocks.get(engine_id, 0)
        RETAINED_BLOCKS.labels(engine_id).set(held)
        if bytes_per_block:
            RETAINED_BYTES.labels(engine_id).set(held * bytes_per_block)
