"""Typed asyncio client for BlockRegistryService."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from boomerang.clients.base import AsyncClient, BoomerangClientError, call
from boomerang.grpcutil import from_rpc_error
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc


class RegistryClient(AsyncClient):
    """BlockRegistryService with per-call deadlines (seconds) and one error type.

    Every registry RPC is idempotent (by natural key or request id), so the channel retries
    UNAVAILABLE transparently.
    """

    service = "boomerang.v1.BlockRegistryService"
    stub_class = rgrpc.BlockRegistryServiceStub

    async def register_engine(self, req: rpb.RegisterEngineRequest, timeout: float | None = None) -> rpb.RegisterEngineResponse:
        return await call("RegisterEngine", self.stub.RegisterEngine, req, timeout or self.timeout)

    async def heartbeat(self, req: rpb.HeartbeatRequest, timeout: float | None = None) -> rpb.HeartbeatResponse:
        return await call("Heartbeat", self.stub.Heartbeat, req, timeout or self.timeout)

    async def register_retained_blocks(
        self, req: rpb.RegisterRetainedBlocksRequest, timeout: float | None = None
    ) -> rpb.RegisterRetainedBlocksResponse:
        return await call("RegisterRetainedBlocks", self.stub.RegisterRetainedBlocks, req, timeout or self.timeout)

    async def claim_reuse(self, req: rpb.ClaimReuseRequest, timeout: float | None = None) -> rpb.ClaimReuseResponse:
        return await call("ClaimReuse", self.stub.ClaimReuse, req, timeout or self.timeout)

    async def register_retained_blocks_batch(
        self, req: rpb.RegisterRetainedBlocksBatchRequest, timeout: float | None = None
    ) -> rpb.RegisterRetainedBlocksBatchResponse:
        return await call("RegisterRetainedBlocksBatch", self.stub.RegisterRetainedBlocksBatch, req, timeout or self.timeout)

    async def claim_reuse_batch(
        self, req: rpb.ClaimReuseBatchRequest, timeout: float | None = None
    ) -> rpb.ClaimReuseBatchResponse:
        return await call("ClaimReuseBatch", self.stub.ClaimReuseBatch, req, timeout or self.timeout)

    async def complete_turn(self, req: rpb.CompleteTurnRequest, timeout: float | None = None) -> rpb.CompleteTurnResponse:
        return await call("CompleteTurn", self.stub.CompleteTurn, req, timeout or self.timeout)

    async def invalidate_engine(
        self, req: rpb.InvalidateEngineRequest, timeout: float | None = None
    ) -> rpb.InvalidateEngineResponse:
        return await call("InvalidateEngine", self.stub.InvalidateEngine, req, timeout or self.timeout)

    async def get_conversation(
        self, req: rpb.GetConversationRequest, timeout: float | None = None
    ) -> rpb.GetConversationResponse:
        return await call("GetConversation", self.stub.GetConversation, req, timeout or self.timeout)

    async def list_leases(self, req: rpb.ListLeasesRequest, timeout: float | None = None) -> rpb.ListLeasesResponse:
        return await call("ListLeases", self.stub.ListLeases, req, timeout or self.timeout)

    async def list_engines(self, req: rpb.ListEnginesRequest, timeout: float | None = None) -> rpb.ListEnginesResponse:
        return await call("ListEngines", self.stub.ListEngines, req, timeout or self.timeout)

    async def watch_lease_keys(self, watcher: str) -> AsyncIterator[rpb.WatchLeaseKeysResponse]:
        """The lease-keys stream (no deadline: it lives until either side ends it)."""
        stream = self.stub.WatchLeaseKeys(rpb.WatchLeaseKeysRequest(watcher=watcher))
        try:
            async for message in stream:
                yield message
        except grpc.aio.AioRpcError as err:
            raise BoomerangClientError("WatchLeaseKeys", from_rpc_error(err)) from None
        finally:
            stream.cancel()
