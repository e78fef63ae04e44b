"""Typed asyncio client for TTLReaperService."""

from __future__ import annotations

from boomerang.clients.base import call
from boomerang.grpcutil.channel import aio_channel
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang.v1 import reaper_service_pb2_grpc as pbgrpc

SERVICE = "boomerang.v1.TTLReaperService"


class ReaperClient:
    """TTLReaperService with per-call deadlines (seconds) and one error type.

    Every reaper RPC is idempotent (ReapNow only expires what is due), so the channel
    retries UNAVAILABLE transparently. ReapNow on a replica that does not lead fails with
    reason `NOT_LEADER`; the error's metadata names the leader.
    """

    def __init__(self, target: str, timeout: float = 5.0):
        self.target = target
        self.timeout = timeout
        self.channel = aio_channel(target, [SERVICE])
        self.stub = pbgrpc.TTLReaperServiceStub(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def __aenter__(self) -> ReaperClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get_status(self, timeout: float | None = None) -> pb.TTLReaperServiceGetStatusResponse:
        """GetStatus."""
        return await call("GetStatus", self.stub.GetStatus, pb.TTLReaperServiceGetStatusRequest(), timeout or self.timeout)

    async def reap_now(self, req: pb.ReapNowRequest, timeout: float | None = None) -> pb.ReapNowResponse:
        """ReapNow."""
        return await call("ReapNow", self.stub.ReapNow, req, timeout or self.timeout)

    async def advise_ttl(self, req: pb.AdviseTTLRequest, timeout: float | None = None) -> pb.AdviseTTLResponse:
        """AdviseTTL (reads the audit history: allow it time)."""
        return await call("AdviseTTL", self.stub.AdviseTTL, req, timeout or max(self.timeout, 60.0))
