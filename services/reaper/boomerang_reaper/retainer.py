"""The leader's retention job: release retained turns that will likely never be pulled.

Every `release_interval_seconds` the leading reaper reads the retained leases
(ListLeases) and the decode engines' free KV blocks (ListEngines, from their heartbeats)
over gRPC, decides with `boomerang_server.retention` (the simulator's decision too), and releases
through the registry's fenced ReleaseLeases: RETAINED → RELEASED in one statement, so a
lease claimed meanwhile is never released under its puller. The evidence, the pauses
between turns per tenant and model, comes from the registration history AdviseTTL reads
(ListRegistrations), refreshed every `retention_evidence_seconds`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable

from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.retention import (
    EngineMemory,
    Evidence,
    Held,
    Params,
    Pauses,
    Policy,
    choose_releases,
)

from boomerang_reaper import metrics
from boomerang_reaper.advice import TurnRecord, observe, read_history
from boomerang_reaper.registry_client import ReaperRegistryClient, epoch
from boomerang_reaper.settings import ReaperSettings

log = logging.getLogger(__name__)
PAGE_SIZE = 1000
MAX_PAGES = 100  # 100,000 retained leases a run; beyond that the newest are left for later runs
RELEASE_CHUNK = 10_000
# A release reaches D in its next release heartbeat (0.5 s) and its freed blocks show in the
# one after: a heartbeat younger than this after a release may not show them yet.
REPORT_SETTLE_SECONDS = 1.0


def evidence_from(records: Iterable[TurnRecord], history_end: float, settle_seconds: float) -> dict[tuple[str, str], Evidence]:
    """Pauses and the share of turns that went on, per (tenant, model).

    A turn younger than `settle_seconds` with no next turn yet may still get one, so it
    counts neither way in the share."""
    pauses: dict[tuple[str, str], list[float]] = defaultdict(list)
    settled: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for o in observe(records):
        key = (o.record.tenant, o.record.model)
        if o.pause is not None:
            pauses[key].append(o.pause.seconds)
            settled[key].append(True)
        elif history_end - o.record.finished_at >= settle_seconds:
            settled[key].append(False)
    return {
        key: Evidence(Pauses(pauses.get(key, ())), sum(went) / len(went) if went else 1.0)
        for key, went in settled.items()
    }


def held_from(leases: Iterable[tpb.Lease], db_now: float) -> list[Held]:
    """The RETAINED leases as the policy sees them."""
    out = []
    for lease in leases:
        if lease.state != tpb.LEASE_STATE_RETAINED:
            continue
        finished = epoch(lease.finish_time)
        out.append(Held(
            lease_id=lease.lease_id, tenant=lease.tenant, model=lease.model, engine_id=lease.engine_id,
            idle_seconds=max(0.0, db_now - finished), cap_seconds=max(0.0, epoch(lease.expire_time) - finished),
            num_tokens=lease.num_tokens, num_blocks=sum(len(g.block_ids) for g in lease.block_groups),
        ))
    return out


class Retainer:
    """Runs the retention policy for the leader (one `run` per interval)."""

    def __init__(
        self, settings: ReaperSettings, registry: ReaperRegistryClient, prefill_seconds_per_token: float
    ):
        self.settings = settings
        self.registry = registry
        self.params = Params(
            min_samples=settings.retention_min_samples,
            min_hold_seconds=settings.retention_min_hold_seconds,
            pressure_free_share=settings.memory_pressure_free_share,
            prefill_seconds_per_token=prefill_seconds_per_token,
        )
        self.default = Policy.parse(settings.retention_policy)
        self.policies = {t: Policy.parse(p) for t, p in settings.retention_tenant_policies.items()}
        self.evidence: dict[tuple[str, str], Evidence] = {}
        self._evidence_at = float("-inf")
        self._released: list[tuple[float, str, int]] = []  # (database time, engine, blocks) of recent releases

    def policy_for(self, tenant: str) -> Policy:
        """The tenant's policy, else the default."""
        return self.policies.get(tenant, self.default)

    def evidence_for(self, tenant: str, model: str) -> Evidence:
        """What the history says of this tenant and model (nothing: no pauses, so TTL-bound)."""
        return self.evidence.get((tenant, model), Evidence())

    async def refresh_evidence(self) -> None:
        """Re-read the history when older than `retention_evidence_seconds`."""
        if time.monotonic() - self._evidence_at < self.settings.retention_evidence_seconds:
            return
        hours = self.settings.retention_history_hours
        records, _, until = await read_history(self.registry, "", hours)
        settle = max([r.engine_ttl_seconds for r in records] + [480])
        self.evidence = evidence_from(records, until.timestamp(), settle)
        self._evidence_at = time.monotonic()

    async def _retained(self) -> list[tpb.Lease]:
        req = rpb.ListLeasesRequest(states=[tpb.LEASE_STATE_RETAINED], page_size=PAGE_SIZE)
        out: list[tpb.Lease] = []
        timeout = self.settings.registry_timeout_seconds
        for _ in range(MAX_PAGES):
            page = await self.registry.list_leases(req, timeout=timeout)
            out.extend(page.leases)
            if not page.next_page_token:
                return out
            req.page_token = page.next_page_token
        log.warning("over %d retained leases: the retention policy looked at the newest only", len(out))
        return out

    async def _memory(self) -> dict[str, EngineMemory]:
        resp = await self.registry.list_engines(rpb.ListEnginesRequest(role=tpb.ENGINE_ROLE_DECODE),
                                                timeout=self.settings.registry_timeout_seconds)
        out = {}
        for e in resp.engines:
            if e.status != tpb.ENGINE_STATUS_ACTIVE:
                continue
            reported = epoch(e.heartbeat_time) - REPORT_SETTLE_SECONDS
            pending = sum(b for at, engine, b in self._released if engine == e.engine_id and at >= reported)
            out[e.engine_id] = EngineMemory(e.free_kv_blocks, e.total_kv_blocks, pending)
        return out

    async def run(self, fence: rpb.ReaperFence, db_now: float, actor: str) -> dict[str, int]:
        """One pass: read, decide, release (as `actor`); leases released per reason."""
        await self.refresh_evidence()
        self._released = [r for r in self._released if r[0] > db_now - 60.0]
        held = {h.lease_id: h for h in held_from(await self._retained(), db_now)}
        engines = await self._memory()
        chosen = choose_releases(
            list(held.values()), self.evidence_for, self.policy_for, engines, self.params
        )
        by_reason: dict[str, list[str]] = defaultdict(list)
        for lease_id, reason in chosen:
            by_reason[reason].append(lease_id)
        released: dict[str, int] = {}
        for reason, ids in sorted(by_reason.items()):
            for i in range(0, len(ids), RELEASE_CHUNK):
                resp = await self.registry.release_leases(
                    rpb.ReleaseLeasesRequest(fence=fence, lease_ids=ids[i:i + RELEASE_CHUNK], reason=reason,
                                             actor=actor),
                    timeout=self.settings.registry_timeout_seconds,
                )
                released[reason] = released.get(reason, 0) + len(resp.released_lease_ids)
                self._released += [(db_now, held[x].engine_id, held[x].num_blocks) for x in resp.released_lease_ids]
            metrics.RELEASED.labels(reason).inc(released.get(reason, 0))
        return released
