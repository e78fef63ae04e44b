"""The gRPC entrypoint of the router: validate, delegate, translate."""

from __future__ import annotations

import grpc

from boomerang.grpcutil.status import rpc
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang_router import convert, requests
from boomerang_router.planner import Router


class RouterServicer(rtgrpc.RouterServiceServicer):
    """RouterService over a Router."""

    def __init__(self, router: Router):
        self.router = router
        self.max_prompt_tokens = router.settings.max_prompt_tokens

    @rpc
    async def PlanTurn(self, request: rtpb.PlanTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.PlanTurnResponse:
        plan = await self.router.plan(requests.plan_turn(request, self.max_prompt_tokens))
        return convert.plan_response(plan)

    @rpc
    async def ReportTurn(self, request: rtpb.ReportTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.ReportTurnResponse:
        result = await self.router.report(requests.report_turn(request, self.max_prompt_tokens))
        return convert.report_response(result)

    @rpc
    async def GetTurnPlan(self, request: rtpb.GetTurnPlanRequest, context: grpc.aio.ServicerContext) -> rtpb.GetTurnPlanResponse:
        created = requests.get_plan(request)
        plan = await self.router.find(request.tenant, request.plan_id, created)
        return rtpb.GetTurnPlanResponse(plan=convert.turn_plan(plan))

    @rpc
    async def ListEngines(
        self, request: rtpb.RouterServiceListEnginesRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.RouterServiceListEnginesResponse:
        requests.list_engines(request)
        role = convert.ROLE_FROM_PROTO.get(request.role)
        entries = self.router.pool.entries(request.model, role)
        return rtpb.RouterServiceListEnginesResponse(engines=[convert.pool_engine(e) for e in entries])
