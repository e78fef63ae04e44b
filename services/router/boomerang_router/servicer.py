"""The gRPC entrypoint of the router: validate (`requests`), delegate (`planner.Router`), and
translate the router's values into the protobuf answers (below)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from boomerang.errors import BoomerangError
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.credentials import CredentialStore
from boomerang_server.enginepool import Role, Source
from boomerang_server.rpc.server import rpc, ts, write_item_error

from boomerang_router import kvparams, listing, requests
from boomerang_router.domain import HandleUse, PlanDecision, PlanReason, Retention
from boomerang_router.engines import PoolEntry
from boomerang_router.kvparams import KvParams
from boomerang_router.learning import CostModels
from boomerang_router.plan_store import PlanRecord
from boomerang_router.planner import Router
from boomerang_router.requests import ReportInput
from boomerang_router.settlement import ReportResult


class RouterServicer(rtgrpc.RouterServiceServicer):
    """RouterService over a Router."""

    def __init__(self, router: Router, credentials: CredentialStore):
        self.router = router
        self.credentials = credentials
        self.max_prompt_tokens = router.settings.max_prompt_tokens

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Authenticate the caller from its channel (run by @rpc before every method).

        Gateways (`service:` principals) and the vLLM hook on prefill engines (`engine:`
        principals) may both plan and report; the tenant in a request is the caller's word
        for whose turn it is, so with `BOOMERANG_REQUIRE_AUTH` anonymous callers are refused.
        """
        await self.credentials.authenticate(context, self.router.settings.require_auth)

    @rpc
    async def PlanTurn(self, request: rtpb.PlanTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.PlanTurnResponse:
        plan = await self.router.plan_turn(requests.plan_turn(request, self.max_prompt_tokens), context.time_remaining())
        response = plan_response(plan)
        if not plan.request_id:
            plan.params = None  # only retries by request id replay the answer; keep memory small
        return response

    @rpc
    async def ReportTurn(self, request: rtpb.ReportTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.ReportTurnResponse:
        result = await self.router.report_turn(requests.report_turn(request, self.max_prompt_tokens))
        return report_response(result)

    @rpc
    async def ReportTurnBatch(
        self, request: rtpb.ReportTurnBatchRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.ReportTurnBatchResponse:
        """Each valid report settled as ReportTurn settles it, all at once; each answer, or the
        error it alone failed with, in the request's order (a validation error in its place).

        At once, not one after another: each report's CompleteTurn then reaches the registry
        together with the others, and the registry's group commit (RegistrationBatcher) settles
        them in a few transactions instead of one each. Measured on a loaded 2-core host, 64
        reports with registrations: router + registry CPU 2.0 ms a report at once against 5.3 ms
        one after another (6.7 ms as 64 ReportTurn calls), 0.09 Postgres commits a report
        against 2.3. Reports of the same plan still run one at a time (`Router.report_turn`
        serializes them per plan id).
        """

        async def one(item: ReportInput | BoomerangError) -> rtpb.ReportTurnBatchResult:
            result = rtpb.ReportTurnBatchResult()
            try:
                if isinstance(item, BoomerangError):
                    raise item
                result.response.CopyFrom(report_response(await self.router.report_turn(item)))
            except Exception as exc:  # noqa: BLE001 - each report's failure is its own answer
                write_item_error(result, exc)
            return result

        inputs = requests.report_batch(request, self.max_prompt_tokens)
        results = await asyncio.gather(*(one(item) for item in inputs))
        return rtpb.ReportTurnBatchResponse(results=results)

    @rpc
    async def GetTurnPlan(self, request: rtpb.GetTurnPlanRequest, context: grpc.aio.ServicerContext) -> rtpb.GetTurnPlanResponse:
        created = requests.get_plan(request)
        plan = await self.router.find_plan(request.tenant, request.plan_id, created)
        return rtpb.GetTurnPlanResponse(plan=turn_plan(plan))

    @rpc
    async def ListTurnPlans(
        self, request: rtpb.ListTurnPlansRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.ListTurnPlansResponse:
        q = requests.list_plans(request)
        plans, token = await listing.list_plans(q, self.router.audit, self.router.repo)
        return rtpb.ListTurnPlansResponse(plans=[turn_plan(p) for p in plans], next_page_token=token)

    @rpc
    async def ListEngines(
        self, request: rtpb.RouterServiceListEnginesRequest, context: grpc.aio.ServicerContext
    ) -> rtpb.RouterServiceListEnginesResponse:
        requests.list_engines(request)
        role = ROLE_FROM_PROTO.get(request.role)
        entries = self.router.pool.entries(request.model, role)
        models = self.router.models
        return rtpb.RouterServiceListEnginesResponse(engines=[pool_engine(e, models) for e in entries])


DECISION = {
    PlanDecision.PULL: rtpb.PLAN_DECISION_PULL,
    PlanDecision.RECOMPUTE: rtpb.PLAN_DECISION_RECOMPUTE,
    PlanDecision.COLD: rtpb.PLAN_DECISION_COLD,
    PlanDecision.PREFILL_ON_DECODE: rtpb.PLAN_DECISION_PREFILL_ON_DECODE,
}
REASON = {reason: rtpb.PlanReason.Value(f"PLAN_REASON_{reason.value}") for reason in PlanReason}
RETENTION = {r: rtpb.RetentionOutcome.Value(f"RETENTION_OUTCOME_{r.value}") for r in Retention}
HANDLE_USE = {h: rtpb.HandleUse.Value(f"HANDLE_USE_{h.value}") for h in HandleUse}
ROLE = {Role.PREFILL: tpb.ENGINE_ROLE_PREFILL, Role.DECODE: tpb.ENGINE_ROLE_DECODE}
ROLE_FROM_PROTO = {v: k for k, v in ROLE.items()}
SOURCE = {Source.REGISTRY: rtpb.ENGINE_SOURCE_REGISTRY, Source.STATIC: rtpb.ENGINE_SOURCE_STATIC}


def lease_state(name: str) -> tpb.LeaseState:
    """LEASE_STATE_CONSUMED for `CONSUMED`; unspecified for ""."""
    return tpb.LeaseState.Value(f"LEASE_STATE_{name}") if name else tpb.LEASE_STATE_UNSPECIFIED


def params(p: KvParams) -> tpb.KvTransferParams:
    """The typed `kv_transfer_params` message (unset optional fields are vLLM's nulls)."""
    msg = tpb.KvTransferParams(do_remote_decode=p.do_remote_decode, do_remote_prefill=p.do_remote_prefill)
    for group in p.remote_block_ids or ():
        msg.remote_block_groups.add(block_ids=list(group))
    for name in kvparams.SCALAR_KEYS:
        value = getattr(p, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def plan_response(r: PlanRecord) -> rtpb.PlanTurnResponse:
    """PlanTurnResponse for a plan."""
    p = r.params if r.params is not None else kvparams.first_turn()
    if r.decision is PlanDecision.PULL and r.params is None:
        raise ValueError(f"plan {r.plan_id} pulls but its params are gone")
    return rtpb.PlanTurnResponse(
        plan_id=r.plan_id,
        decision=DECISION[r.decision],
        reason=REASON[r.reason],
        prefill_engine=rtpb.PlannedEngine(engine_id=r.prefill_engine_id, http_base_url=r.prefill_url),
        decode_engine=rtpb.PlannedEngine(engine_id=r.decode_engine_id, http_base_url=r.decode_url),
        reusable_tokens=r.reusable_tokens,
        recompute_tokens=r.recompute_tokens,
        verified_prefix_tokens=r.verified_tokens,
        kv_transfer_params=params(p),
        kv_transfer_params_json=kvparams.to_json(p),
        lease_id=r.lease_id,
        claim_id=r.claim_id,
        source_engine_id=r.source_engine_id,
        kv_recompute_threshold=r.kv_recompute_threshold,
    )


def report_response(res: ReportResult) -> rtpb.ReportTurnResponse:
    """ReportTurnResponse for a settled report."""
    return rtpb.ReportTurnResponse(
        plan_id=res.record.plan_id,
        claimed_lease_state=lease_state(res.claimed_lease_state),
        retention=RETENTION[res.retention],
        lease=res.lease,
        retention_detail=res.detail,
    )


def turn_plan(r: PlanRecord) -> rtpb.TurnPlan:
    """The audit view of a plan."""
    return rtpb.TurnPlan(
        plan_id=r.plan_id,
        tenant=r.tenant,
        conversation_id=r.conversation_id,
        model=r.model,
        decision=DECISION[r.decision],
        reason=REASON[r.reason],
        prefill_engine=rtpb.PlannedEngine(engine_id=r.prefill_engine_id, http_base_url=r.prefill_url),
        decode_engine=rtpb.PlannedEngine(engine_id=r.decode_engine_id, http_base_url=r.decode_url),
        source_engine_id=r.source_engine_id,
        lease_id=r.lease_id,
        claim_id=r.claim_id,
        prompt_tokens=r.prompt_tokens,
        reusable_tokens=r.reusable_tokens,
        recompute_tokens=r.recompute_tokens,
        verified_prefix_tokens=r.verified_tokens,
        create_time=ts(r.created_at),
        report_time=ts(r.reported_at),
        handle_use=HANDLE_USE[HandleUse(r.handle_use)] if r.handle_use else rtpb.HANDLE_USE_UNSPECIFIED,
        claimed_lease_state=lease_state(r.claimed_lease_state),
        retention=RETENTION[Retention(r.retention)] if r.retention else rtpb.RETENTION_OUTCOME_UNSPECIFIED,
        new_lease_id=r.new_lease_id,
        outcome_detail=r.outcome_detail,
        outcome=r.outcome,
        delivered_cached_tokens=r.delivered_cached_tokens,
    )


def pool_engine(entry: PoolEntry, models: CostModels) -> rtpb.PoolEngine:
    """One pool entry for ListEngines, with what the router has learned of its costs."""
    info = entry.info
    engine = tpb.Engine(
        engine_id=info.engine_id,
        role=ROLE[info.role],
        model=info.model,
        side_channel_host=info.side_channel_host,
        side_channel_port=info.side_channel_port,
        http_base_url=info.http_base_url,
        registration_generation=info.generation,
        kv_blocks_ttl_seconds=info.kv_blocks_ttl_seconds,
        block_size=info.block_size,
        tp_size=info.tp_size,
        dcp_size=info.dcp_size,
        pp_size=info.pp_size,
        bytes_per_block=info.bytes_per_block,
        status=tpb.ENGINE_STATUS_ACTIVE if info.active else tpb.ENGINE_STATUS_DEAD,
        heartbeat_time=ts(info.heartbeat_at),
        in_flight_requests=info.in_flight,
        queued_prompt_tokens=info.queued_prompt_tokens,
        retained_blocks=info.retained_blocks,
        kv_recompute_threshold=info.kv_recompute_threshold,
    )
    return rtpb.PoolEngine(
        engine=engine,
        source=SOURCE[info.source],
        available=entry.available,
        unavailable_reason=entry.unavailable_reason,
        planned_turns=entry.planned_turns,
        planned_prompt_tokens=entry.planned_prompt_tokens,
        load=entry.load,
        prefill_cost=prefill_cost(models, info.engine_id),
        copy_costs=copy_costs(models, info.engine_id),
        inter_token_ms=models.inter_token_ms(info.engine_id),
        first_step_ms=models.first_step_ms(info.engine_id),
    )


def prefill_cost(models: CostModels, engine_id: str) -> rtpb.PrefillCost:
    """An engine's learned prefill cost."""
    c = models.prefill_cost(engine_id)
    fitted = models.prefill.get(engine_id)
    return rtpb.PrefillCost(floor_ms=c.floor_ms, token_ms=c.token_ms, attention_ms=c.attention_ms,
                            context_ms=c.context_ms, observations=fitted.observations if fitted else 0)


def copy_costs(models: CostModels, engine_id: str) -> list[rtpb.CopyCost]:
    """The learned copy costs into an engine, by source engine."""
    out = []
    for (source, target), fitted in sorted(models.copy.items()):
        if target == engine_id:
            c = models.copy_cost(source, target)
            out.append(rtpb.CopyCost(source_engine_id=source, fixed_ms=c.fixed_ms, token_ms=c.token_ms,
                                     observations=fitted.observations))
    return out
