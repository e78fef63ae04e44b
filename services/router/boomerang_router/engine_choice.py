"""The engines' part of a plan: which prefill and decode engine serve it, whether the
claimed lease's engine can still be read from when the plan decides, and what the engines'
learned costs predict (`learning.CostModels`, read, never fitted, here).

The pool is in memory (refreshed in the background), so choosing asks nobody; a model with
no available engine of a role is the one thing that fails a plan (UNAVAILABLE, see
ListEngines), since no turn can run without it.
"""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, replace

from boomerang.errors import BoomerangError, Code

from boomerang_router import metrics
from boomerang_router.domain import ClaimResult, Decision, PlanDecision, decide, decide_started
from boomerang_router.learning import CostModels
from boomerang_router.pool import EngineInfo, EnginePool, Role
from boomerang_router.requests import PlanInput


@dataclass(frozen=True)
class EngineChoice:
    """The engines a plan runs on, with the block size and recompute threshold it decides by."""

    prefill: EngineInfo
    decode: EngineInfo
    threshold: int  # the prefill engine's kv_recompute_threshold
    block_size: int


def pick_engines(pool: EnginePool, p: PlanInput, stats: Tally[str]) -> EngineChoice:
    """The caller's own prefill engine when it names an available one (the vLLM hook), else
    the least-loaded; the least-loaded decode engine; or UNAVAILABLE."""
    prefill = pool.available(p.prefill_engine_id, p.model, Role.PREFILL) if p.prefill_engine_id else None
    prefill = prefill or pool.choose(p.model, Role.PREFILL)
    decode = pool.choose(p.model, Role.DECODE)
    if prefill is None or decode is None:
        role = "PREFILL" if prefill is None else "DECODE"
        stats[f"no_{role.lower()}_engine"] += 1
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
        metrics.DECODE_PAUSE_SECONDS.inc(d.choice.pause_ms / 1000)
        return d, replace(engines, decode=holder)
    return d, engines
