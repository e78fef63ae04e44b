"""Typed asyncio client for TTLReaperService."""

from __future__ import annotations

from boomerang.clients.base import AsyncClient, call
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang.v1 import reaper_service_pb2_grpc as pbgrpc


class ReaperClient(AsyncClient):
    """TTLReaperService with per-call deadlines (seconds) and one error type.

    Every reaper RPC is idempotent (ReapNow only expires what is due), so the channel
    retries UNAVAILABLE transparently. ReapNow on a replica that does not lead fails with
    reason `NOT_LEADER`; the error's metadata names the leader.
    """

    service = "boomerang.v1.TTLReaperService"
    stub_class = pbgrpc.TTLReaperServiceStub

    async def get_status(self, timeout: float | None = None) -> pb.TTLReaperServiceGetStatusResponse:
        return await call("GetStatus", self.stub.GetStatus, pb.TTLReaperServiceGetStatusRequest(), timeout or self.timeout)

    async def reap_now(self, req: pb.ReapNowRequest, timeout: float | None = None) -> pb.ReapNowResponse:
        return await call("ReapNow", self.stub.ReapNow, req, timeout or self.timeout)

    async def advise_ttl(self, req: pb.AdviseTTLRequest, timeout: float | None = None) -> pb.AdviseTTLResponse:
        """AdviseTTL (reads the audit history: allow it time)."""
        return await call("AdviseTTL", self.stub.AdviseTTL, req, timeout or max(self.timeout, 60.0))
