"""The gRPC entrypoint of the block registry: validate, delegate, translate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
from boomerang.errors import BoomerangError, Code, Violations
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.config import asyncpg_dsn
from boomerang_server.credentials import CredentialStore
from boomerang_server.leases import ClaimOutcome
from boomerang_server.rpc.server import rpc, write_item_error
from boomerang_server.validation import check_conversation, check_id, check_text

from boomerang_registry import metrics, wire
from boomerang_registry.claim_store import Row
from boomerang_registry.events import decode_page_token
from boomerang_registry.expiry import ExpiryRepository
from boomerang_registry.group_commit import Registered, RegistrationBatcher
from boomerang_registry.reaper_api import ReaperFacingServicer
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.settings import RegistrySettings
from boomerang_registry.watches import DeadlineHub, LeaseKeysHub, WatchServicer

# Each outcome under its own name in the proto (UNAVAILABLE and NOT_ASKED are the router's).
_OUTCOME = {ClaimOutcome(n.removeprefix("CLAIM_OUTCOME_")): v for n, v in rpb.ClaimOutcome.items() if v}

# The RPCs an engine may call, each only for itself (the engine id the request names).
# Every other RPC is for services (gateway, router, reaper, operators) only.
# Engines may call these as well as the engine-scoped ones: a prefill hook watches the lease
# keys (hashes of its tenants' conversations and prompts, never ids or tokens).
_ENGINE_OPEN = frozenset({"WatchLeaseKeys"})
_ENGINE_SCOPED: dict[str, Callable[[Any], list[str]]] = {
    "RegisterEngine": lambda r: [r.engine.engine_id],
    "Heartbeat": lambda r: [r.engine_id],
    "RegisterRetainedBlocks": lambda r: [r.engine_id],
    "RegisterRetainedBlocksBatch": lambda r: [item.engine_id for item in r.registrations],
}


def _registered(registered: Registered, answer: rpb.RegisterRetainedBlocksResponse) -> None:
    """Count a committed registration (created or repeated, and the leases it superseded) and
    write its answer; the single, batched and turn-end registrations all answer this way."""
    row, created, superseded = registered
    metrics.REGISTRATIONS.labels("created" if created else "repeated").inc()
    if superseded:
        metrics.TRANSITIONS.labels("SUPERSEDED").inc(superseded)
    answer.lease.CopyFrom(wire.lease(row))
    answer.created, answer.superseded_leases = created, superseded


def _claim_response(outcome: ClaimOutcome, row: Row | None, tokens: int, remaining: float) -> rpb.ClaimReuseResponse:
    """A claim's answer (ClaimReuse, or one ClaimReuseBatch result), counted in the claim metrics."""
    metrics.CLAIMS.labels(outcome.value).inc()
    if outcome is ClaimOutcome.CLAIMED:
        metrics.CLAIMED_TOKENS.inc(tokens)
    return rpb.ClaimReuseResponse(
        outcome=_OUTCOME[outcome],
        lease=wire.lease(row) if row is not None else None,
        reusable_tokens=tokens,
        remaining_seconds=remaining,
    )


class BlockRegistryServicer(ReaperFacingServicer, WatchServicer, rgrpc.BlockRegistryServiceServicer):
    """BlockRegistryService over a RegistryRepository."""

    def __init__(
        self,
        repo: RegistryRepository,
        settings: RegistrySettings,
        batcher: RegistrationBatcher,
        credentials: CredentialStore,
    ):
        self.repo = repo
        self.settings = settings
        self.batcher = batcher
        self.credentials = credentials
        self.expiry = ExpiryRepository(repo.owner)  # the reaper's RPCs (reaper_api.py)
        dsn = asyncpg_dsn(settings.require_database())
        self.lease_keys_hub = LeaseKeysHub(dsn, repo.owner, settings.lease_keys_refresh_seconds)
        self.deadline_hub = DeadlineHub(dsn)

    async def close_watches(self) -> None:
        """End every watch stream (the registry drains; watchers reconnect elsewhere)."""
        await self.deadline_hub.close()
        await self.lease_keys_hub.close()

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Authenticate the caller from its channel and check it may call `method` (run by @rpc)."""
        principal = await self.credentials.authenticate(context, self.settings.require_auth)
        engines_of = _ENGINE_SCOPED.get(method)
        if engines_of is None:
            if principal.kind == "engine" and method not in _ENGINE_OPEN:
                raise BoomerangError(Code.PERMISSION_DENIED, "SERVICE_ONLY", f"{method} is for Boomerang services, not engines")
            return
        for engine_id in engines_of(request):
            if not principal.may_act_for_engine(engine_id):
                raise BoomerangError(
                    Code.PERMISSION_DENIED,
                    "ENGINE_MISMATCH",
                    f"{principal} may only {method} as itself, not as engine {engine_id!r}",
                )

    @rpc
    async def RegisterEngine(self, request: rpb.RegisterEngineRequest, context: grpc.aio.ServicerContext) -> rpb.RegisterEngineResponse:
        spec = wire.engine_spec(request, self.settings.default_kv_ttl_seconds)
        row, invalidated = await self.repo.engines.register(spec, request.request_id)
        return rpb.RegisterEngineResponse(engine=wire.engine(row), invalidated_leases=invalidated)

    @rpc
    async def Heartbeat(self, request: rpb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> rpb.HeartbeatResponse:
        wire.heartbeat(request)
        row, released = await self.repo.engines.heartbeat(
            request.engine_id, request.registration_generation, request.in_flight_requests,
            request.queued_prompt_tokens, request.free_kv_blocks, request.total_kv_blocks, request.take_releases,
        )
        for r in released:
            metrics.RELEASES.labels(r.state).inc()
        return rpb.HeartbeatResponse(
            engine=wire.engine(row),
            released=[
                rpb.ReleasedTurn(remote_request_id=r.remote_request_id, state=wire.LEASE_STATE[r.state], lease_id=r.lease_id)
                for r in released
            ],
        )

    @rpc
    async def RegisterRetainedBlocks(
        self, request: rpb.RegisterRetainedBlocksRequest, context: grpc.aio.ServicerContext
    ) -> rpb.RegisterRetainedBlocksResponse:
        blocks = wire.retained_blocks(request, self.settings.max_blocks_per_lease, self.settings.max_tokens_per_lease)
        try:
            registered = await self.batcher.register(blocks)
        except Exception:
            metrics.REGISTRATIONS.labels("rejected").inc()
            raise
        answer = rpb.RegisterRetainedBlocksResponse()
        _registered(registered, answer)
        return answer

    @rpc
    async def RegisterRetainedBlocksBatch(
        self, request: rpb.RegisterRetainedBlocksBatchRequest, context: grpc.aio.ServicerContext
    ) -> rpb.RegisterRetainedBlocksBatchResponse:
        wire.batch_size("registrations", len(request.registrations))
        results = [rpb.RegisterRetainedBlocksBatchResult() for _ in request.registrations]

        valid = []
        for n, item in enumerate(request.registrations):
            try:
                valid.append((n, wire.retained_blocks(
                    item, self.settings.max_blocks_per_lease, self.settings.max_tokens_per_lease
                )))
            except BoomerangError as err:
                metrics.REGISTRATIONS.labels("rejected").inc()
                write_item_error(results[n], err)
        # Queued together, they go through the group commit together (one statement).
        outcomes = await asyncio.gather(*(self.batcher.register(b) for _, b in valid), return_exceptions=True)
        for (n, _), outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                metrics.REGISTRATIONS.labels("rejected").inc()
                write_item_error(results[n], outcome)
                continue
            _registered(outcome, results[n].response)
        return rpb.RegisterRetainedBlocksBatchResponse(results=results)

    @rpc
    async def ClaimReuse(self, request: rpb.ClaimReuseRequest, context: grpc.aio.ServicerContext) -> rpb.ClaimReuseResponse:
        query = wire.claim(request)
        started = time.perf_counter()
        outcome, row, tokens, remaining = await self.repo.claims.claim(query)
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        return _claim_response(outcome, row, tokens, remaining)

    @rpc
    async def ClaimReuseBatch(
        self, request: rpb.ClaimReuseBatchRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ClaimReuseBatchResponse:
        wire.batch_size("claims", len(request.claims))
        results = [rpb.ClaimReuseBatchResult() for _ in request.claims]
        valid: list[int] = []
        queries = []
        for n, item in enumerate(request.claims):
            try:
                queries.append(wire.claim(item))
                valid.append(n)
            except BoomerangError as err:
                write_item_error(results[n], err)
        started = time.perf_counter()
        answers = await self.repo.claims.claim_batch(queries) if queries else []
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        metrics.CLAIM_BATCH_SIZE.observe(len(queries))
        for n, (outcome, row, tokens, remaining) in zip(valid, answers, strict=True):
            results[n].response.CopyFrom(_claim_response(outcome, row, tokens, remaining))
        return rpb.ClaimReuseBatchResponse(results=results)

    @rpc
    async def CompleteTurn(self, request: rpb.CompleteTurnRequest, context: grpc.aio.ServicerContext) -> rpb.CompleteTurnResponse:
        turn = wire.turn_end(request, self.settings.max_blocks_per_lease, self.settings.max_tokens_per_lease)
        ended = await self.batcher.end_turn(turn)
        resp = rpb.CompleteTurnResponse()
        if turn.claim is not None:
            if isinstance(ended.claim, BoomerangError):
                write_item_error(resp.claim, ended.claim)
            elif ended.claim is not None:
                resp.claim.lease.CopyFrom(wire.lease(ended.claim))
        if turn.registration is not None:
            if isinstance(ended.registration, BoomerangError) or ended.registration is None:
                metrics.REGISTRATIONS.labels("rejected").inc()
                write_item_error(resp.registration, ended.registration or BoomerangError(
                    Code.INTERNAL, "NO_OUTCOME", "the registration has no outcome"))
            else:
                _registered(ended.registration, resp.registration.response)
        return resp

    @rpc
    async def InvalidateEngine(
        self, request: rpb.InvalidateEngineRequest, context: grpc.aio.ServicerContext
    ) -> rpb.InvalidateEngineResponse:
        v = Violations()
        check_id(v, "engine_id", request.engine_id)
        v.require(request.below_generation >= 0, "below_generation", "must be non-negative")
        check_id(v, "reason", request.reason)
        check_id(v, "request_id", request.request_id, required=False)
        v.raise_if_any()
        count = await self.repo.engines.invalidate(
            request.engine_id, request.below_generation, request.reason, request.request_id
        )
        return rpb.InvalidateEngineResponse(invalidated_leases=count)

    @rpc
    async def GetConversation(
        self, request: rpb.GetConversationRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetConversationResponse:
        v = Violations()
        check_id(v, "tenant", request.tenant)
        check_conversation(v, "conversation_id", request.conversation_id)
        v.raise_if_any()
        leases, events = await self.repo.events.conversation(request.tenant, request.conversation_id, request.include_events)
        return rpb.GetConversationResponse(
            leases=[wire.lease(r) for r in leases], events=[wire.event(r) for r in events]
        )

    @rpc
    async def ListLeases(self, request: rpb.ListLeasesRequest, context: grpc.aio.ServicerContext) -> rpb.ListLeasesResponse:
        v = Violations()
        check_id(v, "tenant", request.tenant, required=False)
        check_id(v, "engine_id", request.engine_id, required=False)
        v.require(0 <= request.page_size <= 1000, "page_size", "must be 0 (default 100) to 1000")
        states = []
        for i, state in enumerate(request.states):
            name = wire.LEASE_STATE_NAME.get(state)
            if name is None:
                v.add(f"states[{i}]", "must be a LeaseState other than LEASE_STATE_UNSPECIFIED")
            else:
                states.append(name)
        if request.page_token:
            try:
                decode_page_token(request.page_token)
            except ValueError as exc:
                v.add("page_token", str(exc))
        v.raise_if_any()
        rows, token = await self.repo.events.list_leases(
            request.tenant, request.engine_id, states, request.page_size or 100, request.page_token
        )
        return rpb.ListLeasesResponse(leases=[wire.lease(r) for r in rows], next_page_token=token)

    @rpc
    async def ListEngines(self, request: rpb.ListEnginesRequest, context: grpc.aio.ServicerContext) -> rpb.ListEnginesResponse:
        v = Violations()
        check_text(v, "model", request.model)
        v.require(request.role in (0, tpb.ENGINE_ROLE_PREFILL, tpb.ENGINE_ROLE_DECODE), "role", "is not an EngineRole")
        v.raise_if_any()
        rows = await self.repo.engines.listing(request.model, wire.ROLE_NAME.get(request.role, ""))
        return rpb.ListEnginesResponse(engines=[wire.engine(r) for r in rows])
