"""TTL advice: what `decoder_kv_blocks_ttl` buys in reuse and costs in decode-node memory.

Input is the audit history as one record per finished turn (a lease). A turn's *pause* is
the time from its end (the lease's `finished_at`) to the next turn of the same
conversation:
- when the next turn claimed these blocks, the claim event's time (exact);
- when it found nothing (the lease had expired, or was invalidated), the next turn is only
  seen when it ends and registers its own lease, so the pause is bounded above by that end
  (an overestimate by the next turn's own duration, which errs towards a longer TTL);
- a turn with no next turn yet has no pause (it still costs memory, below).

A next turn finds its blocks alive under TTL `t` when `pause < t − safety`: the registry
ends a lease `ttl_margin` before the decode node does and a claim needs some remaining
lifetime, and `safety` is their sum. Memory: the decode node holds a turn's blocks from its
end until a prefill node reads them (the pause, when the next turn came in time and was a
reader) or else for the whole TTL; a next turn that came in time but did not claim (the
lease was superseded unread: a changed history) is not a reader. Block-seconds add that up;
bytes follow when the engine reported its bytes per block; the mean resident figure divides
by the observed period (first turn's end to the end of the history).

The recommendation is the shortest whole-second TTL at which at least the target share of
next turns would have found their blocks alive. The history is the registry's registrations
(ListRegistrations), read for AdviseTTL and for the retention policy's evidence (retainer.py).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime

from boomerang.clients.base import call
from boomerang.errors import Violations
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.validation import check_id

from boomerang_reaper.registry_client import ReaperRegistryClient, epoch


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) of ascending values, interpolating linearly between
    the two nearest ranks (as numpy's default and Postgres' `percentile_cont` do)."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be 0 to 100, got {q}")
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


DEFAULT_CANDIDATES = (30, 60, 120, 180, 300, 480, 600, 900, 1800, 3600)
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 100.0)
DEFAULT_TARGET = 0.95
DEFAULT_SAFETY_SECONDS = 15.0
DEFAULT_HISTORY_HOURS = 168.0
HISTORY_PAGE = 5000  # registrations per ListRegistrations page (about 1 MB)


@dataclass(frozen=True)
class TurnRecord:
    """One finished turn (a lease) as the audit history shows it. Times are epoch seconds."""

    tenant: str
    model: str
    conversation_id: str
    lease_id: str
    finished_at: float
    num_blocks: int
    bytes_per_block: int = 0  # 0: the engine did not report it
    engine_ttl_seconds: int = 0  # the engine's decoder_kv_blocks_ttl; 0: unknown
    claimed_at: float | None = None  # the lease's first CLAIMED event
    state: str = "RETAINED"  # the lease's state now


@dataclass(frozen=True)
class Pause:
    """The wait between a turn's end and its conversation's next turn."""

    seconds: float
    exact: bool  # the next turn claimed the blocks, so its arrival is known
    reader: bool  # a next turn arriving in time would read (and so free) the blocks


@dataclass(frozen=True)
class Observation:
    """A turn and the pause that followed it (None: no next turn in the history)."""

    record: TurnRecord
    pause: Pause | None


@dataclass(frozen=True)
class CandidateOutcome:
    """What one TTL would have given over the history."""

    ttl_seconds: int
    reuse_share: float
    block_seconds: float
    byte_seconds: float
    mean_resident_blocks: float
    mean_resident_bytes: float
    recommended: bool = False
    current: bool = False


@dataclass(frozen=True)
class TtlAdvice:
    """TTL advice for one tenant and model."""

    tenant: str
    model: str
    turns: int
    next_turns: int
    exact_pauses: int
    pause_percentiles: list[tuple[float, float]]  # (percentile, seconds)
    candidates: list[CandidateOutcome]
    recommended_ttl_seconds: int  # 0: no next turn to learn from
    current_ttl_seconds: int  # 0: unknown
    bytes_known_share: float


def observe(records: Iterable[TurnRecord]) -> list[Observation]:
    """Pair every turn with the next turn of its conversation."""
    by_conversation: dict[tuple[str, str], list[TurnRecord]] = defaultdict(list)
    for r in records:
        by_conversation[(r.tenant, r.conversation_id)].append(r)
    out: list[Observation] = []
    for turns in by_conversation.values():
        turns.sort(key=lambda r: (r.finished_at, r.lease_id))
        for turn, nxt in zip(turns, [*turns[1:], None]):
            out.append(Observation(turn, _pause(turn, nxt)))
    return out


def _pause(turn: TurnRecord, nxt: TurnRecord | None) -> Pause | None:
    # Superseded without a claim: the next turn came while the blocks were alive and chose
    # not to read them, so it would not have read them under any TTL either.
    reader = not (turn.state == "SUPERSEDED" and turn.claimed_at is None)
    if turn.claimed_at is not None:
        return Pause(max(0.0, turn.claimed_at - turn.finished_at), exact=True, reader=reader)
    if nxt is not None:
        return Pause(max(0.0, nxt.finished_at - turn.finished_at), exact=False, reader=reader)
    return None


def shortest_ttl(pauses: Sequence[float], target: float, safety: float) -> int:
    """The shortest whole-second TTL under which at least `target` of the pauses are
    shorter than `TTL − safety`; 0 when there are no pauses."""
    if not pauses:
        return 0
    ordered = sorted(pauses)
    # The k-th shortest pause must fit; the epsilon keeps 0.95 × 20 from rounding to 20.000…1.
    k = min(len(ordered), max(1, math.ceil(target * len(ordered) - 1e-9)))
    return math.floor(ordered[k - 1] + safety) + 1


def _held_seconds(o: Observation, ttl: int, safety: float) -> float:
    if o.pause is not None and o.pause.reader and o.pause.seconds < ttl - safety:
        return o.pause.seconds
    return float(ttl)


def evaluate(
    observations: Sequence[Observation], ttl: int, safety: float, span_seconds: float
) -> CandidateOutcome:
    """Reuse share and memory of one TTL over these observations."""
    pauses = [o.pause.seconds for o in observations if o.pause is not None]
    alive = sum(1 for p in pauses if p < ttl - safety)
    block_s = byte_s = 0.0
    for o in observations:
        held = _held_seconds(o, ttl, safety) * o.record.num_blocks
        block_s += held
        byte_s += held * o.record.bytes_per_block
    span = max(span_seconds, 1.0)
    return CandidateOutcome(
        ttl_seconds=ttl,
        reuse_share=alive / len(pauses) if pauses else 0.0,
        block_seconds=block_s,
        byte_seconds=byte_s,
        mean_resident_blocks=block_s / span,
        mean_resident_bytes=byte_s / span,
    )


def advise_group(
    observations: Sequence[Observation],
    target: float = DEFAULT_TARGET,
    safety: float = DEFAULT_SAFETY_SECONDS,
    candidates: Iterable[int] = DEFAULT_CANDIDATES,
    history_end: float | None = None,
) -> TtlAdvice:
    """Advice for one tenant and model's observations (at least one)."""
    if not observations:
        raise ValueError("advice needs at least one turn")
    first = observations[0].record
    pauses = sorted(o.pause.seconds for o in observations if o.pause is not None)
    recommended = shortest_ttl(pauses, target, safety)
    ttls = Counter(o.record.engine_ttl_seconds for o in observations if o.record.engine_ttl_seconds > 0)
    current = ttls.most_common(1)[0][0] if ttls else 0
    end = history_end if history_end is not None else max(o.record.finished_at for o in observations)
    span = end - min(o.record.finished_at for o in observations)
    outcomes = []
    for ttl in sorted({*candidates, *(t for t in (recommended, current) if t > 0)}):
        outcome = evaluate(observations, ttl, safety, span)
        outcomes.append(replace(outcome, recommended=ttl == recommended, current=ttl == current))
    blocks = sum(o.record.num_blocks for o in observations)
    known = sum(o.record.num_blocks for o in observations if o.record.bytes_per_block > 0)
    return TtlAdvice(
        tenant=first.tenant,
        model=first.model,
        turns=len(observations),
        next_turns=len(pauses),
        exact_pauses=sum(1 for o in observations if o.pause is not None and o.pause.exact),
        pause_percentiles=[(q, percentile(pauses, q)) for q in PERCENTILES] if pauses else [],
        candidates=outcomes,
        recommended_ttl_seconds=recommended,
        current_ttl_seconds=current,
        bytes_known_share=known / blocks if blocks else 0.0,
    )


def advise(
    records: Iterable[TurnRecord],
    target: float = DEFAULT_TARGET,
    safety: float = DEFAULT_SAFETY_SECONDS,
    candidates: Iterable[int] = DEFAULT_CANDIDATES,
    model: str = "",
    history_end: float | None = None,
) -> list[TtlAdvice]:
    """Advice per tenant and model, by tenant then model.

    Turns are paired within their conversation before `model` filters them, so a
    conversation that changed model still shows its pauses.
    """
    if not 0 < target <= 1:
        raise ValueError(f"target must be above 0 and at most 1, got {target}")
    groups: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for o in observe(records):
        if not model or o.record.model == model:
            groups[(o.record.tenant, o.record.model)].append(o)
    cands = list(candidates)
    return [advise_group(groups[key], target, safety, cands, history_end) for key in sorted(groups)]


@dataclass(frozen=True)
class AdviceQuery:
    """What to advise on."""

    tenant: str = ""
    model: str = ""
    target: float = DEFAULT_TARGET
    history_hours: float = DEFAULT_HISTORY_HOURS
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES
    safety_seconds: float = DEFAULT_SAFETY_SECONDS


def make_query(
    tenant: str = "",
    model: str = "",
    target: float = 0.0,
    history_hours: float = 0.0,
    candidates: tuple[int, ...] = (),
    safety_seconds: float | None = None,
) -> AdviceQuery:
    """A validated query (zero and empty mean the defaults); INVALID_ARGUMENT naming each
    bad field otherwise."""
    v = Violations()
    check_id(v, "tenant", tenant, required=False)
    v.require(len(model) <= 512, "model", "must be at most 512 characters")
    v.require(0 <= target <= 1, "target_reuse", "must be above 0 and at most 1 (0: default 0.95)")
    v.require(0 <= history_hours <= 8760, "history_hours", "must be 0 (default 168) to 8760 hours")
    v.require(len(candidates) <= 100, "candidate_ttl_seconds", "must list at most 100 TTLs")
    for i, ttl in enumerate(candidates):
        v.require(1 <= ttl <= 86400, f"candidate_ttl_seconds[{i}]", "must be 1 to 86400 seconds")
    if safety_seconds is not None:
        v.require(0 <= safety_seconds <= 3600, "safety_seconds", "must be 0 to 3600 seconds")
    v.raise_if_any()
    return AdviceQuery(
        tenant=tenant,
        model=model,
        target=target or DEFAULT_TARGET,
        history_hours=history_hours or DEFAULT_HISTORY_HOURS,
        candidates=tuple(candidates) or DEFAULT_CANDIDATES,
        safety_seconds=DEFAULT_SAFETY_SECONDS if safety_seconds is None else safety_seconds,
    )


def turn_record(r: rpb.Registration) -> TurnRecord:
    """One registration as the advice reads it."""
    return TurnRecord(
        tenant=r.tenant, model=r.model, conversation_id=r.conversation_id, lease_id=r.lease_id,
        finished_at=epoch(r.finish_time), num_blocks=r.num_blocks, bytes_per_block=r.bytes_per_block,
        engine_ttl_seconds=r.engine_ttl_seconds,
        claimed_at=epoch(r.first_claim_time) if r.HasField("first_claim_time") else None,
        state=tpb.LeaseState.Name(r.state).removeprefix("LEASE_STATE_"),
    )


async def read_history(
    registry: ReaperRegistryClient, tenant: str, hours: float
) -> tuple[list[TurnRecord], datetime, datetime]:
    """The turns registered in the last `hours` (one tenant's, or all), every page of
    ListRegistrations; and the window (start, end) on the database clock."""
    req = rpb.ListRegistrationsRequest(tenant=tenant, history_hours=hours, page_size=HISTORY_PAGE)
    records: list[TurnRecord] = []
    while True:
        page = await call("ListRegistrations", registry.stub.ListRegistrations, req, registry.timeout)
        records.extend(turn_record(r) for r in page.registrations)
        if not page.next_page_token:
            start, end = page.history_start_time, page.history_end_time
            return records, start.ToDatetime(tzinfo=UTC), end.ToDatetime(tzinfo=UTC)
        req.page_token = page.next_page_token


# The advice messages carry the dataclasses' fields under the same names; only the
# nested lists differ in form.
_SCALARS = [f.name for f in fields(TtlAdvice) if f.name not in ("pause_percentiles", "candidates")]
_CANDIDATE = [f.name for f in fields(CandidateOutcome)]


def advice_to_proto(a: TtlAdvice) -> pb.TtlAdvice:
    """A TtlAdvice message."""
    return pb.TtlAdvice(
        **{name: getattr(a, name) for name in _SCALARS},
        pause_percentiles=[pb.PausePercentile(percentile=q, seconds=s) for q, s in a.pause_percentiles],
        candidates=[pb.TtlCandidate(**{name: getattr(c, name) for name in _CANDIDATE}) for c in a.candidates],
    )


def advice_from_proto(m: pb.TtlAdvice) -> TtlAdvice:
    """A TtlAdvice value from its message (`boomerang advise-ttl --reaper` reads it back to print)."""
    return TtlAdvice(
        **{name: getattr(m, name) for name in _SCALARS},
        pause_percentiles=[(p.percentile, p.seconds) for p in m.pause_percentiles],
        candidates=[CandidateOutcome(**{name: getattr(c, name) for name in _CANDIDATE}) for c in m.candidates],
    )
