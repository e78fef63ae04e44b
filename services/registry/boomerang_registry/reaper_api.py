"""The registry RPCs that serve the TTL reaper: fenced expiry, engine sweep, audit retention,
releases, and the reads of its status and advice (CountLiveLeases,
ListRegistrations). A mixin of BlockRegistryServicer: validate, delegate, translate.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from boomerang.errors import Violations
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_server.rpc.server import rpc
from boomerang_server.validation import check_id

from boomerang_registry import metrics, wire
from boomerang_registry.events import decode_history_token
from boomerang_registry.expiry import DEFAULT_ELECTION, RELEASE_REASONS, ExpiryRepository, Fence
from boomerang_registry.repository import RegistryRepository

log = logging.getLogger(__name__)
MAX_EXPIRE_BATCH = 10_000
MAX_RELEASE_BATCH = 10_000
MAX_REGISTRATIONS_PAGE = 10_000


def _fenced(v: Violations, request: Any) -> Fence:
    """Validate what every fenced request carries: its fence, its request id and, where the
    message has one, its actor."""
    msg = request.fence
    if not request.HasField("fence"):
        v.add("fence", "is required")
    else:
        check_id(v, "fence.election", msg.election, required=False)
        v.require(msg.term >= 1, "fence.term", "must be a leadership term (at least 1)")
    if "actor" in request.DESCRIPTOR.fields_by_name:
        check_id(v, "actor", request.actor, required=False)
    check_id(v, "request_id", request.request_id, required=False)
    return Fence(msg.election or DEFAULT_ELECTION, msg.term)


class ReaperFacingServicer:
    """ExpireLeases, SweepEngines, EnforceEventRetention, ReleaseLeases, CountLiveLeases,
    ListRegistrations (the reaper's deadline watch is in watches.py)."""

    repo: RegistryRepository
    expiry: ExpiryRepository

    @rpc
    async def ExpireLeases(
        self, request: rpb.ExpireLeasesRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ExpireLeasesResponse:
        v = Violations()
        fence = _fenced(v, request)
        v.require(0 <= request.max_leases <= MAX_EXPIRE_BATCH, "max_leases", f"must be 0 (default 1000) to {MAX_EXPIRE_BATCH}")
        v.raise_if_any()
        out = await self.expiry.expire_due(
            fence, request.max_leases or 1000, request.actor or "reaper", request.request_id
        )
        return rpb.ExpireLeasesResponse(
            expired_leases=[
                rpb.ExpiredLease(
                    lease_id=r["lease_id"],
                    tenant=r["tenant"],
                    conversation_id=r["conversation_id"],
                    from_state=wire.LEASE_STATE[r["from_state"]],
                    expire_time=wire.ts(r["expires_at"]),
                    lag_seconds=max(0.0, float(r["lag_seconds"])),
                )
                for r in out.expired
            ],
            more_due=out.more_due,
            next_expire_time=wire.ts(out.next_deadline),
            database_time=wire.ts(out.db_now),
        )

    @rpc
    async def SweepEngines(
        self, request: rpb.SweepEnginesRequest, context: grpc.aio.ServicerContext
    ) -> rpb.SweepEnginesResponse:
        v = Violations()
        fence = _fenced(v, request)
        v.require(
            0 <= request.heartbeat_timeout_seconds <= 86400, "heartbeat_timeout_seconds", "must be 0 to 86400 seconds"
        )
        v.raise_if_any()
        out = await self.expiry.sweep_engines(
            fence, request.heartbeat_timeout_seconds, request.actor or "reaper", request.request_id
        )
        return rpb.SweepEnginesResponse(
            dead_engine_ids=out.dead_engine_ids,
            heartbeat_timeout_leases=out.leases_by_reason.get("HEARTBEAT_TIMEOUT", 0),
            dead_engine_leases=out.leases_by_reason.get("ENGINE_DEAD", 0),
            stale_generation_leases=out.leases_by_reason.get("GENERATION_ADVANCED", 0),
            database_time=wire.ts(out.db_now),
        )

    @rpc
    async def EnforceEventRetention(
        self, request: rpb.EnforceEventRetentionRequest, context: grpc.aio.ServicerContext
    ) -> rpb.EnforceEventRetentionResponse:
        v = Violations()
        fence = _fenced(v, request)
        v.require(0 <= request.retention_days <= 3650, "retention_days", "must be 0 (default 30) to 3650 days")
        v.require(0 <= request.days_ahead <= 60, "days_ahead", "must be 0 (default 7) to 60 days")
        v.raise_if_any()
        out = await self.expiry.enforce_retention(fence, request.retention_days or 30, request.days_ahead or 7)
        if out.dropped:
            log.info("dropped audit partitions older than %s: %s", out.cutoff.isoformat(), ", ".join(out.dropped))
        if out.purged_leases:
            log.info("deleted %d ended leases created before %s", out.purged_leases, out.cutoff.isoformat())
        return rpb.EnforceEventRetentionResponse(
            dropped_partitions=out.dropped,
            busy_partitions=out.busy,
            created_partitions=out.created,
            cutoff_time=wire.ts(out.cutoff),
        )

    @rpc
    async def ReleaseLeases(
        self, request: rpb.ReleaseLeasesRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ReleaseLeasesResponse:
        v = Violations()
        fence = _fenced(v, request)
        n = len(request.lease_ids)
        v.require(1 <= n <= MAX_RELEASE_BATCH, "lease_ids", f"must list 1 to {MAX_RELEASE_BATCH} lease ids")
        for i, lease_id in enumerate(request.lease_ids[:MAX_RELEASE_BATCH]):
            wire.check_lease_id(v, f"lease_ids[{i}]", lease_id)
        v.require(request.reason in RELEASE_REASONS, "reason", f"must be one of {', '.join(sorted(RELEASE_REASONS))}")
        v.raise_if_any()

        released = await self.expiry.release(
            list(request.lease_ids), request.reason, request.request_id, request.actor or "reaper", fence
        )
        if released:
            metrics.TRANSITIONS.labels("RELEASED").inc(len(released))
        return rpb.ReleaseLeasesResponse(released_lease_ids=released)

    @rpc
    async def CountLiveLeases(
        self, request: rpb.CountLiveLeasesRequest, context: grpc.aio.ServicerContext
    ) -> rpb.CountLiveLeasesResponse:
        now = await self.expiry.live_figures()
        return rpb.CountLiveLeasesResponse(
            live_leases=now.live, overdue_leases=now.overdue,
            next_expire_time=wire.ts(now.next_deadline), database_time=wire.ts(now.db_now),
        )

    @rpc
    async def ListRegistrations(
        self, request: rpb.ListRegistrationsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ListRegistrationsResponse:
        v = Violations()
        check_id(v, "tenant", request.tenant, required=False)
        v.require(0 < request.history_hours <= 8760, "history_hours", "must be above 0 and at most 8760 hours")
        v.require(0 <= request.page_size <= MAX_REGISTRATIONS_PAGE, "page_size",
                  f"must be 0 (default 1000) to {MAX_REGISTRATIONS_PAGE}")
        if request.page_token:
            try:
                decode_history_token(request.page_token)
            except ValueError as exc:
                v.add("page_token", str(exc))
        v.raise_if_any()
        rows, since, until, token = await self.repo.events.registrations(
            request.tenant, request.history_hours, request.page_size or 1000, request.page_token
        )
        return rpb.ListRegistrationsResponse(
            registrations=[
                rpb.Registration(
                    lease_id=r["lease_id"], tenant=r["tenant"], model=r["model"], conversation_id=r["conversation_id"],
                    num_blocks=r["num_blocks"], state=wire.LEASE_STATE[r["state"]],
                    finish_time=wire.ts(r["finished_at"]), first_claim_time=wire.ts(r["claimed_at"]),
                    bytes_per_block=r["bytes_per_block"], engine_ttl_seconds=r["engine_ttl_seconds"],
                )
                for r in rows
            ],
            history_start_time=wire.ts(since),
            history_end_time=wire.ts(until),
            next_page_token=token,
        )
