"""Typed asyncio client for RouterService (the gateway's and the vLLM hook's view of the router)."""

from __future__ import annotations

from boomerang.clients.base import call
from boomerang.grpcutil.channel import aio_channel
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc

SERVICE = "boomerang.v1.RouterService"


class RouterClient:
    """RouterService with per-call deadlines (seconds) and one error type.

    PlanTurn is idempotent per `request_id` (and harmless without one: a lost answer only
    costs a reuse), ReportTurn per `plan_id`, and the rest have no side effects, so the
    channel retries UNAVAILABLE transparently. Give PlanTurn a short deadline: past it the
    caller should recompute rather than wait (the router itself answers within its claim
    deadline even when the registry is down).
    """

    def __init__(self, target: str, timeout: float = 5.0, plan_timeout: float = 0.25):
        self.target = target
        self.timeout = timeout
        self.plan_timeout = plan_timeout
        self.channel = aio_channel(target, [SERVICE])
        self.stub = rtgrpc.RouterServiceStub(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def __aenter__(self) -> RouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def plan_turn(self, req: rtpb.PlanTurnRequest, timeout: float | None = None) -> rtpb.PlanTurnResponse:
        """PlanTurn (default deadline `plan_timeout`)."""
        return await call("PlanTurn", self.stub.PlanTurn, req, timeout or self.plan_timeout)

    async def report_turn(self, req: rtpb.ReportTurnRequest, timeout: float | None = None) -> rtpb.ReportTurnResponse:
        """ReportTurn."""
        return await call("ReportTurn", self.stub.ReportTurn, req, timeout or self.timeout)

    async def get_turn_plan(self, req: rtpb.GetTurnPlanRequest, timeout: float | None = None) -> rtpb.GetTurnPlanResponse:
        """GetTurnPlan."""
        return await call("GetTurnPlan", self.stub.GetTurnPlan, req, timeout or self.timeout)

    async def list_engines(
        self, req: rtpb.RouterServiceListEnginesRequest, timeout: float | None = None
    ) -> rtpb.RouterServiceListEnginesResponse:
        """ListEngines (the router's pool)."""
        return await call("ListEngines", self.stub.ListEngines, req, timeout or self.timeout)
