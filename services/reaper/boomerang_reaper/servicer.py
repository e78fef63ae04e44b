"""The gRPC entrypoint of the TTL reaper: validate, delegate, translate."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code, Violations, failed_precondition
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang.v1 import reaper_service_pb2_grpc as pbgrpc
from boomerang_server.credentials import CredentialStore
from boomerang_server.rpc.server import rpc, ts
from boomerang_server.validation import check_id

from boomerang_reaper.advice import advice_to_proto, advise, make_query, read_history
from boomerang_reaper.leader import LeaderElection, ReaperRepository
from boomerang_reaper.metrics import LagSummary, stats_from_json
from boomerang_reaper.registry_client import ReaperRegistryClient
from boomerang_reaper.settings import ReaperSettings
from boomerang_reaper.worker import NotLeader, Reaper

log = logging.getLogger(__name__)


def lag_message(summary: LagSummary) -> pb.LagSummary:
    """A LagSummary message."""
    return pb.LagSummary(
        count=summary.count, p50_seconds=summary.p50, p99_seconds=summary.p99, max_seconds=summary.max
    )


class TTLReaperServicer(pbgrpc.TTLReaperServiceServicer):
    """TTLReaperService over this replica's election, worker, repository and registry client."""

    def __init__(
        self,
        settings: ReaperSettings,
        repo: ReaperRepository,
        registry: ReaperRegistryClient,
        election: LeaderElection,
        reaper: Reaper,
        credentials: CredentialStore,
    ):
        self.settings = settings
        self.repo = repo
        self.registry = registry
        self.election = election
        self.reaper = reaper
        self.credentials = credentials

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Authenticate the caller (run by @rpc first): operators and services, not engines."""
        principal = await self.credentials.authenticate(context, self.settings.require_auth)
        if principal.kind == "engine":
            raise BoomerangError(Code.PERMISSION_DENIED, "SERVICE_ONLY", f"{method} is for operators and services, not engines")

    @rpc
    async def GetStatus(
        self, request: pb.TTLReaperServiceGetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.TTLReaperServiceGetStatusResponse:
        row = await self.repo.current(self.settings.election)
        figures = await self.registry.count_live_leases()
        leading = self.election.leader
        if leading:
            stats, lag = self.reaper.stats, self.reaper.stats.lag()
        elif row is not None and row.unexpired:
            stats, lag = stats_from_json(row.stats)
        else:
            stats, lag = None, LagSummary()
        return pb.TTLReaperServiceGetStatusResponse(
            replica_id=self.election.replica_id,
            leader=leading,
            leader_replica_id=row.holder if row is not None and row.unexpired else "",
            term=row.term if row is not None else 0,
            leader_expire_time=ts(row.expires_at) if row is not None else None,
            next_expire_time=figures.next_expire_time if figures.HasField("next_expire_time") else None,
            backlog_leases=figures.overdue_leases,
            live_leases=figures.live_leases,
            expiry_lag=lag_message(lag),
            expired_leases=stats.expired if stats else 0,
            invalidated_leases=stats.invalidated if stats else 0,
            dropped_partitions=stats.dropped_partitions if stats else 0,
            last_expire_time=ts(stats.last_expire_epoch) if stats and stats.last_expire_epoch else None,
            database_time=figures.database_time,
        )

    @rpc
    async def ReapNow(self, request: pb.ReapNowRequest, context: grpc.aio.ServicerContext) -> pb.ReapNowResponse:
        v = Violations()
        check_id(v, "request_id", request.request_id, required=False)
        v.raise_if_any()
        try:
            result = await self.reaper.reap_now(request.sweep_engines, request.enforce_retention, request.request_id)
        except NotLeader:
            # Named from the row as it stands, not this replica's last look at it: a standby
            # that has just started may not have looked yet.
            try:
                row = await self.repo.current(self.settings.election)
            except Exception:  # the answer is NOT_LEADER either way
                log.warning("cannot read the election row to name the leader", exc_info=True)
                row = None
            # The row may still name this replica for a moment after its own lease lapsed.
            leader = row.holder if row is not None and row.unexpired and row.holder != self.election.replica_id else ""
            err = failed_precondition("NOT_LEADER", f"this replica is not the leader (leader: {leader or 'none'})")
            err.metadata["leader"] = leader
            raise err from None
        except BoomerangClientError as exc:
            raise exc.error from None  # the registry's own status (FENCED, UNAVAILABLE, ...)
        return pb.ReapNowResponse(
            term=result.term,
            expired_leases=len(result.lags),
            expiry_lag=lag_message(LagSummary.of(result.lags)),
            invalidated_leases=result.invalidated,
            dead_engine_ids=result.dead_engine_ids,
            dropped_partitions=result.dropped_partitions,
        )

    @rpc
    async def AdviseTTL(self, request: pb.AdviseTTLRequest, context: grpc.aio.ServicerContext) -> pb.AdviseTTLResponse:
        query = make_query(
            tenant=request.tenant,
            model=request.model,
            target=request.target_reuse,
            history_hours=request.history_hours,
            candidates=tuple(request.candidate_ttl_seconds),
            safety_seconds=request.safety_seconds if request.HasField("safety_seconds") else None,
        )
        records, since, until = await read_history(self.registry, query.tenant, query.history_hours)
        advice = advise(
            records, target=query.target, safety=query.safety_seconds, candidates=query.candidates,
            model=query.model, history_end=until.timestamp(),
        )
        return pb.AdviseTTLResponse(
            advice=[advice_to_proto(a) for a in advice],
            history_start_time=ts(since),
            history_end_time=ts(until),
            target_reuse=query.target,
            safety_seconds=query.safety_seconds,
        )
