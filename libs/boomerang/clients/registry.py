"""Typed asyncio client for BlockRegistryService."""

from __future__ import annotations

from boomerang.clients.base import call
from boomerang.grpcutil.channel import aio_channel
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc

SERVICE = "boomerang.v1.BlockRegistryService"


class RegistryClient:
    """BlockRegistryService with per-call deadlines (seconds) and one error type.

    Every registry RPC is idempotent (by natural key or request id), so the channel retries
    UNAVAILABLE transparently.
    """

    def __init__(self, target: str, timeout: float = 5.0):
        self.target = target
        self.timeout = timeout
        self.channel = aio_channel(target, [SERVICE])
        self.stub = rgrpc.BlockRegistryServiceStub(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def register_engine(self, req: rpb.RegisterEngineRequest, timeout: float | None = None) -> rpb.RegisterEngineResponse:
        """RegisterEngine."""
        return await call("RegisterEngine", self.stub.RegisterEngine, req, timeout or self.timeout)

    async def heartbeat(self, req: rpb.HeartbeatRequest, timeout: float | None = None) -> rpb.HeartbeatResponse:
        """Heartbeat."""
        return await call("Heartbeat", self.stub.Heartbeat, req, timeout or self.timeout)

    async def register_retained_blocks(
        self, req: rpb.RegisterRetainedBlocksRequest, timeout: float | None = None
    ) -> rpb.RegisterRetainedBlocksResponse:
        """RegisterRetainedBlocks."""
        return await call("RegisterRetainedBlocks", self.stub.RegisterRetainedBlocks, req, timeout or self.timeout)

    async def claim_reuse(self, req: rpb.ClaimReuseRequest, timeout: float | None = None) -> rpb.ClaimReuseResponse:
        """ClaimReuse."""
        return await call("ClaimReuse", self.stub.ClaimReuse, req, timeout or self.timeout)

    async def claim_reuse_batch(
        self, req: rpb.ClaimReuseBatchRequest, timeout: float | None = None
    ) -> rpb.ClaimReuseBatchResponse:
        """ClaimReuseBatch."""
        return await call("ClaimReuseBatch", self.stub.ClaimReuseBatch, req, timeout or self.timeout)

    async def release_claim(self, req: rpb.ReleaseClaimRequest, timeout: float | None = None) -> rpb.ReleaseClaimResponse:
        """ReleaseClaim."""
        return await call("ReleaseClaim", self.stub.ReleaseClaim, req, timeout or self.timeout)

    async def mark_consumed(self, req: rpb.MarkConsumedRequest, timeout: float | None = None) -> rpb.MarkConsumedResponse:
        """MarkConsumed."""
        return await call("MarkConsumed", self.stub.MarkConsumed, req, timeout or self.timeout)

    async def invalidate_engine(
        self, req: rpb.InvalidateEngineRequest, timeout: float | None = None
    ) -> rpb.InvalidateEngineResponse:
        """InvalidateEngine."""
        return await call("InvalidateEngine", self.stub.InvalidateEngine, req, timeout or self.timeout)

    async def get_conversation(
        self, req: rpb.GetConversationRequest, timeout: float | None = None
    ) -> rpb.GetConversationResponse:
        """GetConversation."""
        return await call("GetConversation", self.stub.GetConversation, req, timeout or self.timeout)

    async def list_leases(self, req: rpb.ListLeasesRequest, timeout: float | None = None) -> rpb.ListLeasesResponse:
        """ListLeases."""
        return await call("ListLeases", self.stub.ListLeases, req, timeout or self.timeout)

    async def list_engines(self, req: rpb.ListEnginesRequest, timeout: float | None = None) -> rpb.ListEnginesResponse:
        """ListEngines."""
        return await call("ListEngines", self.stub.ListEngines, req, timeout or self.timeout)
