"""The engines: the pool plans choose from, the engines of one plan, and keeping the pool current.

Which engines may serve a turn (static or registry, dead, stale, without an HTTP base URL)
is `boomerang_server.enginepool`'s, shared with the gateway. The router adds load: what
engines report in heartbeats combined with what this router planned and has not yet seen
reported (taking the larger of each, since a heartbeat may or may not include the router's
latest turns). A prefill engine's load is its queued prompt tokens plus a weight per
in-flight turn; a decode engine's is its in-flight turns, ties going to the engine with the
least retained KV memory. It also reads each model's block size and each prefill engine's
recompute threshold from the engines, with defaults for engines that report none.

A plan's engines (`pick_engines`) come from the pool in memory, so choosing asks nobody; a
model with no available engine of a role is the one thing that fails a plan (UNAVAILABLE,
see ListEngines), since no turn can run without it. `decide_plan` tells the decision whether
the claimed lease's engine can still be read from and what the engines' learned costs
predict (`learning.CostModels`, read, never fitted, here).

Plans never ask the registry about engines; a background task refreshes the pool from
`ListEngines` every `engine_refresh_seconds` (`boomerang_server.enginepool`, shared
with the gateway: a failed refresh keeps the last snapshot). Static engines (`--prefill`,
`--decode`) are probed with `GET <url>/health`; after `failures` consecutive failed probes an
engine leaves the pool until a probe succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import httpx
from boomerang.errors import BoomerangError, Code
from boomerang_server.enginepool import EngineInfo, EngineTable, Role
from boomerang_server.enginepool import PoolEntry as TableEntry
from prometheus_client import Counter as Counted

from boomerang_router.domain import (
    ClaimResult,
    Decision,
    PlanDecision,
    PlanInput,
    decide,
    decide_started,
)
from boomerang_router.learning import CostModels

log = logging.getLogger(__name__)

DECODE_PAUSE_SECONDS = Counted(
    "boomerang_router_decode_prefill_pause_seconds",
    "Predicted seconds the decode engines' running decodes are paused by the prefills planned on them "
    "(PREFILL_ON_DECODE): the cost such a plan puts on the other turns.",
)


@dataclass
class PoolEntry(TableEntry):
    """An engine with its availability and the router's own load accounting."""

    planned_turns: int = 0
    planned_prompt_tokens: int = 0
    load: float = 0.0


@dataclass
class EnginePool(EngineTable):
    """The engines plans may choose from, and how busy each is."""

    inflight_token_weight: int = 256
    default_block_size: int = 16
    default_threshold: int = 64
    _planned: dict[str, list[int]] = field(default_factory=dict)  # id → [turns, tokens]

    def candidates(self, model: str, role: Role) -> list[PoolEntry]:
        """Every engine of `role` for `model`, available or not, with its load."""
        return [self._score(e) for e in super().candidates(model, role)]

    def entries(self, model: str = "", role: Role | None = None) -> list[PoolEntry]:
        """The pool for ListEngines: static and registry engines, by role then id, with their load."""
        return [self._score(e) for e in super().entries(model, role)]

    def _score(self, entry: TableEntry) -> PoolEntry:
        turns, tokens = self._planned.get(entry.info.engine_id, (0, 0))
        in_flight = max(entry.info.in_flight, turns)
        if entry.info.role is Role.PREFILL:
            load = float(max(entry.info.queued_prompt_tokens, tokens) + self.inflight_token_weight * in_flight)
        else:
            load = float(in_flight)
        return PoolEntry(entry.info, entry.available, entry.unavailable_reason, entry.models, turns, tokens, load)

    def choose(self, model: str, role: Role) -> EngineInfo | None:
        """The least-loaded available engine of `role` for `model`, or None."""
        best: tuple[float, int, str] | None = None
        chosen: EngineInfo | None = None
        for entry in self.candidates(model, role):
            if not entry.available:
                continue
            info = entry.info
            retained = info.retained_blocks * (info.bytes_per_block or 1) if role is Role.DECODE else 0
            key = (entry.load, retained, info.engine_id)
            if best is None or key < best:
                best, chosen = key, info
        return chosen

    def available(self, engine_id: str, model: str, role: Role) -> EngineInfo | None:
        """The engine `engine_id` when plans may choose it for (`model`, `role`), else None."""
        for entry in super().candidates(model, role):
            if entry.info.engine_id == engine_id and entry.available:
                return entry.info
        return None

    def block_size(self, model: str) -> int:
        """Tokens per block of `model`'s decode engines (the most common), else the default."""
        sizes = Counter(
            e.info.block_size
            for e in self.registry.values()
            if e.info.role is Role.DECODE and e.info.model == model and e.info.block_size > 0
        )
        return sizes.most_common(1)[0][0] if sizes else self.default_block_size

    def threshold(self, prefill: EngineInfo) -> int:
        """The prefill engine's own `kv_recompute_threshold`, else the default."""
        return prefill.kv_recompute_threshold or self.default_threshold

    def add_planned(self, engine_id: str, turns: int, tokens: int) -> None:
        """Count (or, with negative numbers, uncount) turns planned on an engine."""
        slot = self._planned.setdefault(engine_id, [0, 0])
        slot[0] = max(0, slot[0] + turns)
        slot[1] = max(0, slot[1] + tokens)
        if slot == [0, 0]:
            del self._planned[engine_id]


@dataclass(frozen=True)
class EngineChoice:
    """The engines a plan runs on, with the block size and recompute threshold it decides by."""

    prefill: EngineInfo
    decode: EngineInfo
    threshold: int  # the prefill engine's kv_recompute_threshold
    block_size: int


def pick_engines(pool: EnginePool, p: PlanInput) -> EngineChoice:
    """The caller's own prefill engine when it names an available one (the vLLM hook), else
    the least-loaded; the least-loaded decode engine; or UNAVAILABLE."""
    prefill = pool.available(p.prefill_engine_id, p.model, Role.PREFILL) if p.prefill_engine_id else None
    prefill = prefill or pool.choose(p.model, Role.PREFILL)
    decode = pool.choose(p.model, Role.DECODE)
    if prefill is None or decode is None:
        role = "PREFILL" if prefill is None else "DECODE"
        raise BoomerangError(
            Code.UNAVAILABLE,
            f"NO_{role}_ENGINE",
            f"no available {role.lower()} engine serves model {p.model!r}; see ListEngines",
        )
    block_size = p.chain.block_size if p.chain is not None else pool.block_size(p.model)
    return EngineChoice(prefill, decode, pool.threshold(prefill), block_size)


def decide_plan(
    pool: EnginePool, models: CostModels, p: PlanInput, engines: EngineChoice, claim: ClaimResult
) -> tuple[Decision, EngineChoice]:
    """The plan decision (`domain.decide`), told whether the pool still sees the claimed
    lease's engine alive (it may see a stopped heartbeat before the registry does) and what
    the engines' learned costs predict; a prefill on D runs on the lease's engine."""
    if p.turn_started:
        return decide_started(claim, p.prompt_tokens, engines.block_size, engines.threshold), engines
    lease = claim.lease
    if lease is None:
        return decide(claim, p.prompt_tokens, engines.block_size, engines.threshold), engines
    alive = pool.source_alive(lease.engine_id, lease.engine_generation)
    holder = pool.available(lease.engine_id, p.model, Role.DECODE) if p.can_prefill_on_decode else None
    costs = models.costs(engines.prefill.engine_id, lease.engine_id, holder.engine_id if holder else None)
    d = decide(claim, p.prompt_tokens, engines.block_size, engines.threshold, alive, costs, p.prefill_cached)
    if d.decision is PlanDecision.PREFILL_ON_DECODE and holder is not None and d.choice is not None:
        models.paused(holder.engine_id, d.choice.pause_ms)
        DECODE_PAUSE_SECONDS.inc(d.choice.pause_ms / 1000)
        return d, replace(engines, decode=holder)
    return d, engines


async def every(name: str, seconds: float, fn: Callable[[], Awaitable[None]]) -> None:
    """Run `fn` every `seconds` until cancelled; a failure is logged and the loop goes on."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await fn()
        except Exception:
            log.debug("%s failed", name, exc_info=True)


class HealthProber:
    """Probes static engines' `/health` and records the verdict in the pool."""

    def __init__(self, pool: EnginePool, failures: int = 2):
        self.pool = pool
        self.failures = failures
        self._misses: dict[str, int] = {}
        self._client: httpx.AsyncClient | None = None

    async def probe_all(self) -> None:
        """Probe every static engine once, concurrently."""
        if not self.pool.static:
            return
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=1.0, trust_env=False)
        entries = list(self.pool.static.values())
        results = await asyncio.gather(*(self._probe(e.info.http_base_url) for e in entries))
        for entry, ok in zip(entries, results):
            engine_id = entry.info.engine_id
            misses = 0 if ok else self._misses.get(engine_id, 0) + 1
            self._misses[engine_id] = misses
            if ok and not entry.available:
                log.info("static engine %s is healthy again", engine_id)
                self.pool.set_static_health(engine_id, True)
            elif misses >= self.failures and entry.available:
                log.warning("static engine %s failed %d health checks; leaving the pool", engine_id, misses)
                self.pool.set_static_health(engine_id, False)

    async def _probe(self, base_url: str) -> bool:
        assert self._client is not None
        try:
            resp = await self._client.get(base_url + "/health")
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
