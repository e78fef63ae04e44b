"""AdviseTTL end to end: a validated query, the history read from the registry, the advice
computed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from boomerang.errors import Violations

from boomerang_reaper.advice import (
    DEFAULT_CANDIDATES,
    DEFAULT_SAFETY_SECONDS,
    DEFAULT_TARGET,
    TtlAdvice,
    advise,
)
from boomerang_reaper.registry_api import ReaperRegistryClient

DEFAULT_HISTORY_HOURS = 168.0
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


@dataclass(frozen=True)
class AdviceQuery:
    """What to advise on."""

    tenant: str = ""
    model: str = ""
    target: float = DEFAULT_TARGET
    history_hours: float = DEFAULT_HISTORY_HOURS
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES
    safety_seconds: float = DEFAULT_SAFETY_SECONDS


@dataclass(frozen=True)
class AdviceReport:
    """The advice and the history window it came from."""

    query: AdviceQuery
    advice: list[TtlAdvice] = field(default_factory=list)
    history_start: datetime | None = None
    history_end: datetime | None = None


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
    if tenant and (len(tenant) > 128 or not _PRINTABLE.match(tenant)):
        v.add("tenant", "must be printable ASCII without spaces, at most 128 characters")
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


async def advise_from_history(registry: ReaperRegistryClient, query: AdviceQuery) -> AdviceReport:
    """Read the history (ListRegistrations) and compute the advice."""
    records, since, until = await registry.history(query.tenant, query.history_hours)
    advice = advise(
        records,
        target=query.target,
        safety=query.safety_seconds,
        candidates=query.candidates,
        model=query.model,
        history_end=until.timestamp(),
    )
    return AdviceReport(query, advice, since, until)
