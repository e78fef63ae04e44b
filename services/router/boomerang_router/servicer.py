"""The gRPC entrypoint of the router: validate, delegate, translate."""

from __future__ import annotations

from typing import Any

import grpc
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang_server.credentials import CredentialStore
from boomerang_server.rpc.server import rpc, write_item_error

from boomerang_router import convert, listing, reports, requests
from boomerang_router.planner import Router


class RouterServicer(rtgrpc.RouterServiceServicer):
    """RouterService over a Router."""

    def __init__(self, router: Router, credentials: CredentialStore | None = None):
        self.router = router
        self.credentials = credentials
        self.max_prompt_tokens = router.settings.max_prompt_tokens

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Authenticate the caller from its channel (run by @rpc before every method).

        Gateways (`service:` principals) and the vLLM hook on prefill engines (`engine:`
        principals) may both plan and report; the tenant in a request is the caller's word
        for whose turn it is, so with `BOOMERANG_REQUIRE_AUTH` anonymous callers are refused.
        """
        if self.credentials is not None:
            await self.credentials.authenticate(context, self.router.settings.require_auth)

    @rpc
    async def PlanTurn(self, request: rtpb.PlanTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.PlanTurnResponse:
        plan = await self.router.plan_turn(requests.plan_turn(request, self.max_prompt_tokens), context.time_remaining())
        response = convert.plan_response(plan)
        if not plan.request_id:
            plan.params = None  # only retries by request id replay the answer; keep memory small
        return response

    @rpc
    async def ReportTurn(self, request: rtpb.ReportTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.ReportTurnResponse:
        result = await self.router.report_turn(requests.report_turn(request, self.max_prompt_tokens))
        return convert.report_response(result)

    @rpc
    async def ReportTurnBatch(
        self, request: rtpb.ReportTurnBatchRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.ReportTurnBatchResponse:
        inputs = requests.report_batch(request, self.max_prompt_tokens)
        outcomes = await reports.report_each(self.router.report_turn, inputs)
        results = [rtpb.ReportTurnBatchResult() for _ in outcomes]
        for result, outcome in zip(results, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                write_item_error(result, outcome)
            else:
                result.response.CopyFrom(convert.report_response(outcome))
        return rtpb.ReportTurnBatchResponse(results=results)

    @rpc
    async def GetTurnPlan(self, request: rtpb.GetTurnPlanRequest, context: grpc.aio.ServicerContext) -> rtpb.GetTurnPlanResponse:
        created = requests.get_plan(request)
        plan = await self.router.find_plan(request.tenant, request.plan_id, created)
        return rtpb.GetTurnPlanResponse(plan=convert.turn_plan(plan))

    @rpc
    async def ListTurnPlans(
        self, request: rtpb.ListTurnPlansRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.ListTurnPlansResponse:
        q = requests.list_plans(request)
        router = self.router
        plans, token = await listing.list_plans(q, router.audit, router.repo, router.settings.block_size)
        return rtpb.ListTurnPlansResponse(plans=[convert.turn_plan(p) for p in plans], next_page_token=token)

    @rpc
    async def ListEngines(
        self, request: rtpb.RouterServiceListEnginesRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.RouterServiceListEnginesResponse:
        requests.list_engines(request)
        role = convert.ROLE_FROM_PROTO.get(request.role)
        entries = self.router.pool.entries(request.model, role)
        models = self.router.models
        return rtpb.RouterServiceListEnginesResponse(engines=[convert.pool_engine(e, models) for e in entries])
