"""Decode memory under a fixed TTL and under Boomerang's releases, replayed in simulated time.

One decode engine (D) with a finite KV pool (`KVStore`, vLLM's pinning: a finished turn's
blocks stay until one read or its TTL) serves many conversations. A conversation's turns
come after a pause drawn from its tenant's distribution; after each turn it ends with some
probability. A next turn pulls D's previous turn when the registry still hands its lease
out; some turns recompute instead (history edited, below vLLM's threshold, router degraded),
which leaves the previous turn superseded. A turn D cannot allocate for waits until blocks
are freed (`waited`).

Two policies, same workload (same seed):

- `fixed-ttl`: vLLM alone. Every unread turn stays `ttl` seconds.
- `boomerang`: the registry releases what nobody will pull: a superseded turn at once; a
  retained turn once it has waited longer than its tenant's p99 pause between turns
  (learned from the pauses seen so far; `ttl − margin` until `min_samples` were seen: the
  conservative default), never beyond `ttl − margin`; under memory pressure the least
  valuable first (prefill time a pull saves × probability of a next turn, per block). The
  registry decides first (the lease leaves RETAINED, so no later claim gets it); D frees
  the blocks `release_delay` later (the heartbeat that carries the release).

The retention decisions are the live reaper's (boomerang_server.retention): the hold, and the
value per block that orders releases under pressure.

Every pull reads through `KVStore.read`, which checks the blocks still hold the turn's
tokens: a read of a released block is counted (`bad_reads`) and must stay 0.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from boomerang_server.retention import (
    Evidence,
    Held,
    Params,
    Pauses,
    Policy,
    hold_seconds,
    least_valuable_first,
)

from boomerang_tools.sim.kvstore import Allocation, HandleKind, KVStore, PoolExhausted, ReadError


class SimClock:
    """Simulated seconds (the replay sets them)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


@dataclass(frozen=True)
class Tenant:
    """A kind of traffic: how long its users pause between turns (lognormal)."""

    name: str
    share: float
    pause_median_s: float
    pause_sigma: float


@dataclass(frozen=True)
class HbmWorkload:
    """The demo's HBM workload (defaults): agents that call back within seconds and people
    who pause for tens of seconds, a quarter of conversations ending after each turn."""

    conversations: int = 600
    arrivals_per_s: float = 0.2
    end_probability: float = 0.25
    max_turns: int = 16
    recompute_share: float = 0.08  # turns P recomputes though the lease is live (edited, degraded)
    tenants: tuple[Tenant, ...] = (Tenant("agents", 0.6, 3.0, 0.8), Tenant("chat", 0.4, 15.0, 0.7))
    first_prompt: tuple[int, int] = (1500, 6000)
    added_per_turn: tuple[int, int] = (100, 1200)
    output: tuple[int, int] = (50, 400)
    decode_s_per_token: float = 0.02
    prefill_s_per_token: float = 0.00002061  # the hook's default: Qwen3-32B on AWS's figures
    block_size: int = 16
    pool_blocks: int = 60_000
    ttl_s: float = 480.0
    margin_s: float = 10.0
    release_delay_s: float = 0.5  # D's release heartbeat interval
    min_samples: int = 50
    seed: int = 7


@dataclass
class HbmResult:
    """One policy's figures."""

    policy: str
    block_seconds: float = 0.0
    peak_retained_blocks: int = 0
    turns: int = 0
    next_turns: int = 0  # turns after a conversation's first
    pulls: int = 0
    waited: int = 0  # turns that waited for decode memory
    wait_seconds: float = 0.0
    bad_reads: int = 0
    released: dict[str, int] = field(default_factory=dict)
    lost_to_release: int = 0  # a next turn that found its turn released early (reuse lost)

    @property
    def pull_share(self) -> float:
        return self.pulls / self.next_turns if self.next_turns else 0.0


@dataclass
class _Conv:
    cid: int
    tenant: Tenant
    tokens: list[int]
    rng: random.Random  # its own: both policies see the very same conversations
    turn: int = 0
    lease: str | None = None  # D's request id of the live lease, while RETAINED in the registry
    finished_at: float = 0.0
    released_early: bool = False  # its live turn was released by the policy or memory pressure


class Replay:
    """One policy over the workload."""

    def __init__(self, w: HbmWorkload, policy: str):
        if policy not in ("fixed-ttl", "boomerang"):
            raise ValueError(f"policy {policy!r}: fixed-ttl or boomerang")
        self.w, self.name = w, policy
        self.clock = SimClock()
        self.kv = KVStore(w.pool_blocks, w.block_size, self.clock)  # type: ignore[arg-type]
        self.result = HbmResult(policy)
        self.rng = random.Random(w.seed)
        self.events: list[tuple[float, int, str, object]] = []
        self._n = 0
        self.pauses = {t.name: Pauses() for t in w.tenants}
        # The registry's policy as the reaper runs it: p99 of the pauses, TTL-bound until
        # `min_samples` were seen; no floor (the workload's agents come back within seconds).
        self.params = Params(min_samples=w.min_samples, min_hold_seconds=0.0,
                             prefill_seconds_per_token=w.prefill_s_per_token)
        self.policy = Policy.parse("ttl" if policy == "fixed-ttl" else "p99")
        self.live: dict[str, _Conv] = {}  # D request id → its conversation, while RETAINED
        self.waiting: list[tuple[float, _Conv, int]] = []

    def _at(self, when: float, kind: str, item: object) -> None:
        self._n += 1
        heapq.heappush(self.events, (when, self._n, kind, item))

    # -- the registry's policy -------------------------------------------------------------

    def _evidence(self, tenant: str, model: str = "") -> Evidence:
        return Evidence(self.pauses[tenant], continue_share=1 - self.w.end_probability)

    def _hold(self, tenant: Tenant) -> float:
        hold = hold_seconds(self.policy, self._evidence(tenant.name), self.w.ttl_s - self.w.margin_s, self.params)
        assert hold is not None  # neither policy here is `off`
        return hold

    def _held(self, rid: str) -> Held:
        conv = self.live[rid]
        return Held(rid, conv.tenant.name, "", "d", self.clock.t - conv.finished_at, self.w.ttl_s - self.w.margin_s,
                    len(conv.tokens), self.kv.blocks_for(len(conv.tokens)))

    def _release(self, rid: str, reason: str) -> None:
        """The registry ends the lease (no claim gets it from now on); D frees it later."""
        conv = self.live.pop(rid, None)
        if conv is None:
            return
        if conv.lease == rid:
            conv.lease = None
            conv.released_early = reason in ("RETENTION_POLICY", "MEMORY_PRESSURE")
        self.result.released[reason] = self.result.released.get(reason, 0) + 1
        if self.name == "boomerang":
            self._at(self.clock.t + self.w.release_delay_s, "free", rid)

    # -- the replay ------------------------------------------------------------------------

    def run(self) -> HbmResult:
        w = self.w
        t = 0.0
        for cid in range(w.conversations):
            t += self.rng.expovariate(w.arrivals_per_s)
            tenant = self.rng.choices(w.tenants, [x.share for x in w.tenants])[0]
            rng = random.Random(w.seed * 1_000_003 + cid)
            prompt = [rng.randrange(50_000) for _ in range(rng.randint(*w.first_prompt))]
            self._at(t, "turn", _Conv(cid, tenant, prompt, rng))
        while self.events:
            when, _, kind, item = heapq.heappop(self.events)
            self.clock.t = when
            getattr(self, f"_on_{kind}")(item)
        self.kv.meter()
        self.result.block_seconds = self.kv.block_seconds
        self.result.peak_retained_blocks = self.kv.retained_peak
        return self.result

    def _on_turn(self, conv: _Conv) -> None:
        w, r = self.w, self.result
        r.turns += 1
        if conv.turn > 0:
            r.next_turns += 1
            self.pauses[conv.tenant.name].add(self.clock.t - conv.finished_at)
            prev = conv.lease
            r.lost_to_release += int(prev is None and conv.released_early)
            recompute = conv.rng.random() < w.recompute_share  # drawn either way: same sequence per policy
            if prev is not None and not recompute:
                self.live.pop(prev, None)
                conv.lease = None
                try:  # the pull: one read of exactly the blocks the lease names
                    handle = self.kv.handles[prev]
                    got = self.kv.read(prev, handle.block_ids, len(conv.tokens), handle.generation)
                    r.pulls += int(got == conv.tokens)
                    r.bad_reads += int(got != conv.tokens)
                except (KeyError, ReadError):
                    r.bad_reads += 1  # the registry handed out a lease D no longer held
        conv.tokens = conv.tokens + [conv.rng.randrange(50_000) for _ in range(conv.rng.randint(*w.added_per_turn))]
        self._admit(conv, self.clock.t, conv.rng.randint(*w.output))

    def _admit(self, conv: _Conv, asked: float, out: int) -> None:
        need = len(conv.tokens) + out
        try:
            alloc = self._allocate(need)
        except PoolExhausted:
            if asked == self.clock.t:
                self.result.waited += 1
            self.waiting.append((asked, conv, out))
            return
        if asked < self.clock.t:
            self.result.wait_seconds += self.clock.t - asked
        self._at(self.clock.t + out * self.w.decode_s_per_token, "finish", (conv, alloc, out))

    def _allocate(self, need: int) -> Allocation:
        try:
            return self.kv.allocate(need)
        except PoolExhausted:
            if self.name != "boomerang":
                raise
        # Memory pressure: the registry releases the least valuable retained turns until the
        # request fits (D frees them with the release; the request waits for that).
        short = self.kv.blocks_for(need) - len(self.kv.free)
        for rid in [h.lease_id for h in least_valuable_first(map(self._held, self.live), self._evidence, self.params)]:
            if short <= 0:
                break
            short -= len(self.kv.handles[rid].block_ids) if rid in self.kv.handles else 0
            self._release(rid, "MEMORY_PRESSURE")
        raise PoolExhausted("waiting for released blocks")

    def _on_finish(self, item: tuple[_Conv, Allocation, int]) -> None:
        conv, alloc, out = item
        w = self.w
        conv.tokens = conv.tokens + [conv.rng.randrange(50_000) for _ in range(out)]
        conv.turn += 1
        conv.finished_at = self.clock.t
        conv.released_early = False
        rid = f"d-{conv.cid}-{conv.turn}"
        self.kv.pin(HandleKind.RETAINED, rid, alloc, conv.tokens, w.ttl_s, 0)
        self._at(self.clock.t + w.ttl_s, "expire", rid)
        if conv.lease is not None:  # recomputed: the registry supersedes the previous turn
            self._release(conv.lease, "SUPERSEDED")
        conv.lease = rid
        self.live[rid] = conv
        self._at(self.clock.t + self._hold(conv.tenant), "policy", rid)
        ends = conv.turn >= w.max_turns or conv.rng.random() < w.end_probability
        if not ends:
            pause = math.exp(math.log(conv.tenant.pause_median_s) + conv.tenant.pause_sigma * conv.rng.gauss(0, 1))
            self._at(self.clock.t + pause, "turn", conv)
        self._retry_waiting()

    def _on_policy(self, rid: str) -> None:
        if rid in self.live and self.name == "boomerang":
            self._release(rid, "RETENTION_POLICY")

    def _on_expire(self, rid: str) -> None:
        if rid in self.live:
            self._release(rid, "EXPIRED")
        if self.kv.sweep():
            self._retry_waiting()

    def _on_free(self, rid: str) -> None:
        if self.kv.drop(rid):
            self._retry_waiting()

    def _retry_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for asked, conv, out in waiting:
            self._admit(conv, asked, out)


def compare(w: HbmWorkload | None = None) -> tuple[HbmResult, HbmResult]:
    """(fixed TTL, Boomerang) on the same workload."""
    w = w or HbmWorkload()
    return Replay(w, "fixed-ttl").run(), Replay(w, "boomerang").run()


# The targets, checked on every run.
MAX_BLOCK_SECONDS_SHARE = 0.20
MIN_PULLS_KEPT = 0.98


def figures(fixed: HbmResult, boomerang: HbmResult) -> dict[str, Any]:
    """The comparison's figures and whether each target holds."""
    share = boomerang.block_seconds / fixed.block_seconds if fixed.block_seconds else 0.0
    kept = boomerang.pulls / fixed.pulls if fixed.pulls else 1.0
    return {
        "policies": {r.policy: {**asdict(r), "pull_share": round(r.pull_share, 4)} for r in (fixed, boomerang)},
        "block_seconds_share": round(share, 4),
        "pulls_kept": round(kept, 4),
        "targets_met": share <= MAX_BLOCK_SECONDS_SHARE and kept >= MIN_PULLS_KEPT and boomerang.bad_reads == 0,
    }
