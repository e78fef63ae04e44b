"""Preload live leases straight into Postgres with COPY, shaped as registrations write them.

Each lease row carries what the registry's `REGISTER_BATCH_SQL` would have written for a
RegisterRetainedBlocks of that conversation on its decode engine (the engine's model,
generation, side channel and layout; block ids per KV-cache group; the token chain; the
deadline on the engine's TTL less the registry's margin), and each gets its REGISTERED
row in `lease_events`, as the real registration appends. The tables' triggers run (the deadline NOTIFY included).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from boomerang_tools.bench.database import copy_registrations
from boomerang_tools.bench.workload import BLOCK_SIZE, Conversation, chain_for, prompt_end

CHUNK = 10_000


@dataclass(frozen=True)
class EngineRow:
    """A registered decode engine, as its leases copy it."""

    engine_id: str
    model: str
    generation: int
    host: str
    port: int
    ttl_seconds: int


def _block_ids(c: Conversation) -> str:
    start = (c.index * 131) % 1_000_000
    return "[[" + ",".join(map(str, range(start, start + c.num_blocks))) + "]]"


def lease_records(
    convs: Iterable[Conversation],
    engines: list[EngineRow],
    margin_seconds: float,
    deadline: Callable[[Conversation, datetime], datetime] | None = None,
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Lease rows and their REGISTERED event rows for `convs`, in the order of the registry's
    `database.PRELOAD_LEASE_COLUMNS` and `PRELOAD_EVENT_COLUMNS`."""
    now = datetime.now(UTC)
    leases: list[tuple[object, ...]] = []
    events: list[tuple[object, ...]] = []
    for c in convs:
        e = engines[c.engine]
        chain = chain_for(c)
        lease_id = uuid.uuid4()
        if deadline is not None:
            expires = deadline(c, now)
            finished = expires - timedelta(seconds=e.ttl_seconds - margin_seconds)
        else:
            finished = now - timedelta(milliseconds=c.index % 5000)
            expires = finished + timedelta(seconds=e.ttl_seconds - margin_seconds)
        leases.append((
            lease_id, c.tenant, c.conversation_id, e.model, e.engine_id, e.generation,
            f"chatcmpl-{lease_id.hex[:24]}", _block_ids(c), c.num_blocks, c.num_tokens, BLOCK_SIZE,
            chain.block_hashes, chain.tail_hash, e.host, e.port, 1, 1, 1, "RETAINED", 1,
            finished, now, expires, now, *prompt_end(c, chain),
        ))
        events.append((now, lease_id, c.tenant, c.conversation_id, None, "RETAINED", "REGISTERED", "registry",
                       f"bench-{lease_id.hex[:16]}"))
    return leases, events


async def copy_leases(
    conns: Sequence[asyncpg.Connection],
    convs: list[Conversation],
    engines: list[EngineRow],
    margin_seconds: float,
    deadline: Callable[[Conversation, datetime], datetime] | None = None,
    progress: Callable[[int], None] | None = None,
) -> float:
    """COPY `convs` as live leases (chunks of 10k, one transaction each); returns seconds.

    Each connection loads every n-th chunk while helper processes build the next ones, so
    building (Python) and loading (the server) overlap.
    """
    started = time.perf_counter()
    chunks = [convs[i : i + CHUNK] for i in range(0, len(convs), CHUNK)]
    loop = asyncio.get_running_loop()
    # Spawned, not forked: the parent has gRPC threads, which a fork must not copy.
    with ProcessPoolExecutor(len(conns), mp_context=multiprocessing.get_context("spawn")) as pool:

        def build(i: int) -> asyncio.Future[tuple[list[tuple[object, ...]], list[tuple[object, ...]]]]:
            return loop.run_in_executor(pool, lease_records, chunks[i], engines, margin_seconds, deadline)

        async def load(first: int, conn: asyncpg.Connection) -> None:
            mine = list(range(first, len(chunks), len(conns)))
            ahead = [build(i) for i in mine[:2]]
            for k, i in enumerate(mine):
                leases, events = await ahead[k]
                if k + 2 < len(mine):
                    ahead.append(build(mine[k + 2]))
                await copy_registrations(conn, leases, events)
                if progress is not None:
                    progress(len(chunks[i]))

        await asyncio.gather(*(load(j, c) for j, c in enumerate(conns)))
    return time.perf_counter() - started


def block_ids_json(c: Conversation) -> list[list[int]]:
    """The block-id groups a lease of `c` holds (for registrations through the RPC)."""
    groups: list[list[int]] = json.loads(_block_ids(c))
    return groups
