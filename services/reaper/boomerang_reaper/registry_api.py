"""The registry as the reaper calls it: the typed registry client plus its reaper RPCs.

The reaper reads the registry's tables only through these: its status and gauges through
CountLiveLeases, AdviseTTL's and the retention policy's history through ListRegistrations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
from boomerang.clients.base import BoomerangClientError, call
from boomerang.clients.registry import RegistryClient
from boomerang.grpcutil import from_rpc_error
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_reaper.advice import TurnRecord

HISTORY_PAGE = 5000  # registrations per ListRegistrations page (about 1 MB)


def _epoch(ts: object) -> float:
    return float(ts.seconds + ts.nanos / 1e9)  # type: ignore[attr-defined]


def turn_record(r: rpb.Registration) -> TurnRecord:
    """One registration as the advice reads it."""
    return TurnRecord(
        tenant=r.tenant, model=r.model, conversation_id=r.conversation_id, lease_id=r.lease_id,
        finished_at=_epoch(r.finish_time), num_blocks=r.num_blocks, bytes_per_block=r.bytes_per_block,
        engine_ttl_seconds=r.engine_ttl_seconds,
        claimed_at=_epoch(r.first_claim_time) if r.HasField("first_claim_time") else None,
        state=tpb.LeaseState.Name(r.state).removeprefix("LEASE_STATE_"),
    )


class ReaperRegistryClient(RegistryClient):
    """RegistryClient with WatchLeaseDeadlines, ExpireLeases, SweepEngines,
    EnforceEventRetention, ReleaseLeases, CountLiveLeases and ListRegistrations."""

    async def watch_lease_deadlines(self, watcher: str) -> AsyncIterator[rpb.WatchLeaseDeadlinesResponse]:
        """The deadline-hint stream (no deadline: it lives until either side ends it)."""
        stream = self.stub.WatchLeaseDeadlines(rpb.WatchLeaseDeadlinesRequest(watcher=watcher))
        try:
            async for message in stream:
                yield message
        except grpc.aio.AioRpcError as err:
            raise BoomerangClientError("WatchLeaseDeadlines", from_rpc_error(err)) from None
        finally:
            stream.cancel()

    async def expire_leases(self, req: rpb.ExpireLeasesRequest, timeout: float | None = None) -> rpb.ExpireLeasesResponse:
        """ExpireLeases."""
        return await call("ExpireLeases", self.stub.ExpireLeases, req, timeout or self.timeout)

    async def sweep_engines(self, req: rpb.SweepEnginesRequest, timeout: float | None = None) -> rpb.SweepEnginesResponse:
        """SweepEngines."""
        return await call("SweepEngines", self.stub.SweepEngines, req, timeout or self.timeout)

    async def enforce_event_retention(
        self, req: rpb.EnforceEventRetentionRequest, timeout: float | None = None
    ) -> rpb.EnforceEventRetentionResponse:
        """EnforceEventRetention."""
        return await call("EnforceEventRetention", self.stub.EnforceEventRetention, req, timeout or self.timeout)

    async def release_leases(
        self, req: rpb.ReleaseLeasesRequest, timeout: float | None = None
    ) -> rpb.ReleaseLeasesResponse:
        """ReleaseLeases."""
        return await call("ReleaseLeases", self.stub.ReleaseLeases, req, timeout or self.timeout)

    async def count_live_leases(self, timeout: float | None = None) -> rpb.CountLiveLeasesResponse:
        """CountLiveLeases."""
        return await call("CountLiveLeases", self.stub.CountLiveLeases, rpb.CountLiveLeasesRequest(),
                          timeout or self.timeout)

    async def history(self, tenant: str, hours: float) -> tuple[list[TurnRecord], datetime, datetime]:
        """The turns registered in the last `hours` (one tenant's, or all), every page of
        ListRegistrations; and the window (start, end) on the database clock."""
        req = rpb.ListRegistrationsRequest(tenant=tenant, history_hours=hours, page_size=HISTORY_PAGE)
        records: list[TurnRecord] = []
        while True:
            page = await call("ListRegistrations", self.stub.ListRegistrations, req, self.timeout)
            records.extend(turn_record(r) for r in page.registrations)
            if not page.next_page_token:
                return records, page.history_start_time.ToDatetime(tzinfo=UTC), page.history_end_time.ToDatetime(tzinfo=UTC)
            req.page_token = page.next_page_token
