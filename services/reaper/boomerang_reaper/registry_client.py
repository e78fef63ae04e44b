"""The registry as the reaper calls it: the typed registry client plus its reaper RPCs.

The reaper reads the registry's tables only through these: its status and gauges through
CountLiveLeases, AdviseTTL's and the retention policy's history through ListRegistrations
(advice.read_history).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from boomerang.clients.base import BoomerangClientError, call
from boomerang.clients.registry import RegistryClient
from boomerang.grpcutil import from_rpc_error
from boomerang.v1 import registry_service_pb2 as rpb
from google.protobuf.timestamp_pb2 import Timestamp


def epoch(ts: Timestamp) -> float:
    """Epoch seconds of a protobuf Timestamp."""
    return float(ts.seconds + ts.nanos / 1e9)


class ReaperRegistryClient(RegistryClient):
    """RegistryClient with WatchLeaseDeadlines, ExpireLeases, SweepEngines,
    EnforceEventRetention, ReleaseLeases and CountLiveLeases."""

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
