"""Typed asyncio client for RouterService (the gateway's and the vLLM hook's view of the router)."""

from __future__ import annotations

from typing import Any

from boomerang.clients.base import AsyncClient, call
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc


class RouterClient(AsyncClient):
    """RouterService with per-call deadlines (seconds) and one error type.

    PlanTurn is idempotent per `request_id` (and harmless without one: a lost answer only
    costs a reuse), ReportTurn per `plan_id`, and the rest have no side effects, so the
    channel retries UNAVAILABLE transparently. Give PlanTurn a short deadline: past it the
    caller should recompute rather than wait (the router itself answers within its claim
    deadline even when the registry is down).
    """

    service = "boomerang.v1.RouterService"
    stub_class = rtgrpc.RouterServiceStub

    def __init__(self, target: str, timeout: float = 5.0, plan_timeout: float = 0.25, stub: Any = None):
        super().__init__(target, timeout, stub)
        self.plan_timeout = plan_timeout

    async def plan_turn(self, req: rtpb.PlanTurnRequest, timeout: float | None = None) -> rtpb.PlanTurnResponse:
        """PlanTurn (default deadline `plan_timeout`)."""
        return await call("PlanTurn", self.stub.PlanTurn, req, timeout or self.plan_timeout)

    async def report_turn(self, req: rtpb.ReportTurnRequest, timeout: float | None = None) -> rtpb.ReportTurnResponse:
        return await call("ReportTurn", self.stub.ReportTurn, req, timeout or self.timeout)

    async def report_turn_batch(
        self, req: rtpb.ReportTurnBatchRequest, timeout: float | None = None
    ) -> rtpb.ReportTurnBatchResponse:
        """ReportTurnBatch: one result per report, in order (a refused report fails alone)."""
        return await call("ReportTurnBatch", self.stub.ReportTurnBatch, req, timeout or self.timeout)

    async def get_turn_plan(self, req: rtpb.GetTurnPlanRequest, timeout: float | None = None) -> rtpb.GetTurnPlanResponse:
        return await call("GetTurnPlan", self.stub.GetTurnPlan, req, timeout or self.timeout)

    async def list_turn_plans(
        self, req: rtpb.ListTurnPlansRequest, timeout: float | None = None
    ) -> rtpb.ListTurnPlansResponse:
        """ListTurnPlans (one page of a conversation's plans, oldest first)."""
        return await call("ListTurnPlans", self.stub.ListTurnPlans, req, timeout or self.timeout)

    async def list_engines(
        self, req: rtpb.RouterServiceListEnginesRequest, timeout: float | None = None
    ) -> rtpb.RouterServiceListEnginesResponse:
        """ListEngines (the router's pool)."""
        return await call("ListEngines", self.stub.ListEngines, req, timeout or self.timeout)
