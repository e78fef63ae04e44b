"""The retention policy: which retained turns to release before their TTL, and which first.

Free of SQL and gRPC; the reaper runs it against live leases (boomerang_reaper.retainer) and
the simulator against simulated ones (boomerang_tools.sim.hbm), so both decide alike.

- **Hold while a next turn is still likely.** A tenant's policy holds a lease idle at most
  a quantile of the pauses between turns observed for its tenant and model (p99 by
  default), never beyond the lease's own TTL-bound life. Until `min_samples` pauses were
  seen the quantile is not trusted and the hold is the TTL (the conservative default);
  `min_hold_seconds` is a floor under any learned hold.
- **Under memory pressure, the least valuable first.** A decode engine whose free share of
  KV blocks falls below `pressure_free_share` has its leases released, least valuable
  first, until the blocks they hold would bring it back to that share. A lease's value per
  block is the prefill time a pull would save × the probability that a next turn still
  comes, given how long the conversation has been idle, ÷ the blocks it holds.
- A tenant whose policy is `off` is never released early, by either rule.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

RETENTION_POLICY = "RETENTION_POLICY"
MEMORY_PRESSURE = "MEMORY_PRESSURE"

_QUANTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


class Pauses:
    """Observed pauses between a turn's end and its conversation's next turn, sorted."""

    def __init__(self, seen: Iterable[float] = ()) -> None:
        self.seen: list[float] = sorted(seen)

    def __len__(self) -> int:
        return len(self.seen)

    def add(self, pause: float) -> None:
        """One more observed pause."""
        bisect.insort(self.seen, pause)

    def quantile(self, q: float) -> float:
        """The `q` quantile (nearest rank below); at least one pause must have been seen."""
        return self.seen[min(len(self.seen) - 1, int(q * len(self.seen)))]

    def survival(self, age: float) -> float:
        """P(pause > age) among the observed pauses (1 with none observed)."""
        if not self.seen:
            return 1.0
        return 1.0 - bisect.bisect_right(self.seen, age) / len(self.seen)


@dataclass(frozen=True)
class Evidence:
    """What the history says about a tenant and model's conversations."""

    pauses: Pauses = field(default_factory=Pauses)
    continue_share: float = 1.0  # turns followed by a next turn (1: unknown, assume they go on)


@dataclass(frozen=True)
class Policy:
    """A tenant's retention: `off`, `ttl` (hold to the TTL; memory pressure may still release),
    or a quantile of observed pauses (`p99`)."""

    mode: str = "quantile"
    quantile: float = 0.99

    @classmethod
    def parse(cls, text: str) -> Policy:
        """`off`, `ttl` or `pNN` (e.g. `p99`, `p99.9`); ValueError naming the forms otherwise."""
        value = text.strip().lower()
        if value in ("off", "ttl"):
            return cls(mode=value)
        m = _QUANTILE.match(value)
        if m and 0 < float(m.group(1)) < 100:
            return cls(mode="quantile", quantile=float(m.group(1)) / 100)
        raise ValueError(f"retention policy {text!r} must be off, ttl or pNN (a percentile of pauses, e.g. p99)")

    def __str__(self) -> str:
        return self.mode if self.mode != "quantile" else f"p{self.quantile * 100:g}"


@dataclass(frozen=True)
class Params:
    """The policy's knobs shared by every tenant."""

    min_samples: int = 200
    min_hold_seconds: float = 30.0
    pressure_free_share: float = 0.1
    prefill_seconds_per_token: float = 0.00002061


@dataclass(frozen=True)
class Held:
    """A retained (unclaimed) lease as the policy sees it."""

    lease_id: str
    tenant: str
    model: str
    engine_id: str
    idle_seconds: float  # since the turn finished
    cap_seconds: float  # how long it may be held at most: its TTL-bound life from the turn's end
    num_tokens: int
    num_blocks: int


@dataclass(frozen=True)
class EngineMemory:
    """A decode engine's KV pool as its last heartbeat reported it (0 total: not reported)."""

    free_blocks: int
    total_blocks: int
    # Released already but maybe not yet freed in the report: D takes a release in one
    # heartbeat and reports the freed blocks in a later one, so they count as free meanwhile.
    pending_blocks: int = 0


def hold_seconds(policy: Policy, evidence: Evidence, cap: float, params: Params) -> float | None:
    """How long to hold an idle lease (None: the policy never releases it)."""
    if policy.mode == "off":
        return None
    if policy.mode == "ttl" or len(evidence.pauses) < params.min_samples:
        return cap
    return min(cap, max(params.min_hold_seconds, evidence.pauses.quantile(policy.quantile)))


def next_turn_probability(idle: float, evidence: Evidence) -> float:
    """P(a next turn still comes | the conversation has been idle `idle` seconds)."""
    go_on = evidence.continue_share * evidence.pauses.survival(idle)
    ends = 1.0 - evidence.continue_share
    return go_on / (go_on + ends) if go_on + ends > 0 else 0.0


def value_per_block(num_tokens: int, num_blocks: int, p_next: float, prefill_seconds_per_token: float) -> float:
    """Prefill seconds a pull would save × P(next turn), per block held."""
    return num_tokens * prefill_seconds_per_token * p_next / max(1, num_blocks)


Lookup = Callable[[str, str], Evidence]


def least_valuable_first(held: Iterable[Held], evidence: Lookup, params: Params) -> list[Held]:
    """`held` ordered by value per block, lowest first (ties: the longest idle first)."""
    def value(h: Held) -> tuple[float, float]:
        p = next_turn_probability(h.idle_seconds, evidence(h.tenant, h.model))
        return value_per_block(h.num_tokens, h.num_blocks, p, params.prefill_seconds_per_token), -h.idle_seconds

    return sorted(held, key=value)


def choose_releases(
    held: Sequence[Held],
    evidence: Lookup,
    policy_for: Callable[[str], Policy],
    engines: Mapping[str, EngineMemory],
    params: Params,
) -> list[tuple[str, str]]:
    """The leases to release now and why: (lease id, RETENTION_POLICY | MEMORY_PRESSURE)."""
    out: list[tuple[str, str]] = []
    keep: list[Held] = []
    freed: dict[str, int] = {}  # blocks the policy's releases free, per engine
    for h in held:
        hold = hold_seconds(policy_for(h.tenant), evidence(h.tenant, h.model), h.cap_seconds, params)
        # A hold as long as the lease's life leaves it to its deadline: the reaper expires it.
        if hold is not None and hold < h.cap_seconds and h.idle_seconds >= hold:
            out.append((h.lease_id, RETENTION_POLICY))
            freed[h.engine_id] = freed.get(h.engine_id, 0) + h.num_blocks
        elif hold is not None:
            keep.append(h)
    for engine_id, mem in sorted(engines.items()):
        short = pressure_shortfall(mem, params.pressure_free_share) - freed.get(engine_id, 0)
        if short <= 0:
            continue
        for h in least_valuable_first((x for x in keep if x.engine_id == engine_id), evidence, params):
            if short <= 0:
                break
            out.append((h.lease_id, MEMORY_PRESSURE))
            short -= h.num_blocks
    return out


def pressure_shortfall(mem: EngineMemory, free_share: float) -> int:
    """Blocks to free for the engine to reach `free_share` free (0: no pressure, or not reported)."""
    if mem.total_blocks <= 0:
        return 0
    return max(0, math.ceil(free_share * mem.total_blocks) - mem.free_blocks - mem.pending_blocks)
