"""Ending claims at the registry: a reported turn's, and those the router will not hand out.

ReportTurn's registry work settles the claimed handle and registers D's retained blocks, both
in one CompleteTurn call, which the registry runs in one transaction. The `turn_plans` row
is not in that transaction: the router owns that table and writes it in its own batches off
the turn's path (repository.AuditWriter), and the registry never touches it. Every call
here is idempotent at the registry (a settlement by claim id, a registration by the decode
engine's `remote_request_id`, RegisterEngine by generation), so a repeated report repeats
them harmlessly. A registry that cannot be reached makes the report fail with UNAVAILABLE
(the caller retries); a registry that refuses the blocks (a stale generation, a dead
engine) is an outcome, recorded, not an error.

A claim nobody will read is given back (CompleteTurn with the claim not read) by the
`ClaimKeeper`, in the background: when the router decides against pulling after it claimed,
when the caller went away before the answer, and when a claim call timed out but may still
have committed. For the last, an orphan probe re-asks ClaimReuse under the same claim id
with an unreachable `min_reusable_tokens`: that can only return the earlier claim
(CLAIM_SQL's `prior`), never take a new one. It releases what it finds only while no plan
holds the claim, because a claim id derived from a caller's request id is shared by that
caller's retries, here or on another replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import from_code_number
from boomerang.resilience import TRANSIENT_CODES
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_router.domain import KvParams, ReportInput, Retention, accepts_pull
from boomerang_router.engines import EnginePool
from boomerang_router.plan_store import PlanRecord, PlanStore
from boomerang_router.repository import TurnPlanRepository
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

# How the registry ended a turn (`Reporter.end_turn`): the claimed lease's state,
# why settling it failed, the retention, the new lease, and why registering the blocks failed.
TurnEnding = tuple[str, str, Retention, tpb.Lease | None, str]


_LEASE_STATE_NAME = {v: k for k, v in tpb.LeaseState.items()}


def turn_claim(
    lease_id: str, claim_id: str, read: bool, release_reason: str = "PREFILL_DID_NOT_READ"
) -> rpb.TurnClaim:
    """A PULL plan's claim, settled at its turn's end: consumed when read, else given back."""
    if read:
        return rpb.TurnClaim(lease_id=lease_id, claim_id=claim_id, use=rpb.CLAIM_USE_READ)
    return rpb.TurnClaim(
        lease_id=lease_id, claim_id=claim_id, use=rpb.CLAIM_USE_NOT_READ, release_reason=release_reason
    )


@dataclass
class CompleteTurnAnswer:
    """CompleteTurn's answer: each part's result, or the error that part alone failed with."""

    claim_state: str = ""  # the claimed lease's state after it, e.g. `CONSUMED`
    claim_error: BoomerangClientError | None = None
    created: bool = False
    lease: tpb.Lease | None = None  # the registered lease
    registration_error: BoomerangClientError | None = None


def _item_error(
    item: rpb.TurnClaimResult | rpb.RegisterRetainedBlocksBatchResult,
) -> BoomerangClientError | None:
    """The error one part of CompleteTurn alone failed with, or None."""
    if not item.error_code:
        return None
    error = from_code_number(item.error_code, item.error_reason, item.error_message)
    return BoomerangClientError("CompleteTurn", error)


async def complete_turn(
    client: RegistryClient,
    tenant: str,
    claim: rpb.TurnClaim | None,
    retained: rpb.RegisterRetainedBlocksRequest | None,
    timeout: float,
) -> CompleteTurnAnswer:
    """CompleteTurn: the claim settled and the blocks registered in one call (either may be None)."""
    req = rpb.CompleteTurnRequest(tenant=tenant, claim=claim, registration=retained)
    resp = await client.complete_turn(req, timeout=timeout)
    out = CompleteTurnAnswer()
    if claim is not None:
        out.claim_error = _item_error(resp.claim)
        if out.claim_error is None:
            state = _LEASE_STATE_NAME.get(resp.claim.lease.state, "LEASE_STATE_UNSPECIFIED")
            out.claim_state = state.removeprefix("LEASE_STATE_")
    if retained is not None:
        out.registration_error = _item_error(resp.registration)
        if out.registration_error is None:
            registered = resp.registration.response
            out.created, out.lease = registered.created, registered.lease
    return out


def registry_down(err: BoomerangClientError) -> BoomerangError:
    """The error a caller gets when the registry could not be reached: retry later."""
    return BoomerangError(
        Code.UNAVAILABLE, "REGISTRY_UNAVAILABLE", f"the block registry did not answer ({err}); retry the call"
    )


@dataclass
class ReportResult:
    """What ReportTurn did (`rpc_surface` builds the answer from it)."""

    record: PlanRecord
    claimed_lease_state: str
    retention: Retention
    lease: tpb.Lease | None
    detail: str


class Reporter:
    """The registry calls behind ReportTurn."""

    def __init__(self, settings: RouterSettings, registry: RegistryClient, pool: EnginePool):
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self._vouched_at: dict[str, float] = {}
        self._vouching: set[asyncio.Task[None]] = set()

    def vouch_for(self, engine_id: str, generation: int) -> None:
        """A finished turn proves its decode engine alive: heartbeat for it if it does not.

        Engines that the router only knows from their handles (real vLLM without the hook)
        never heartbeat, and would leave every pool and lose their leases to the reaper's
        liveness sweep one timeout after their registration. An engine whose own heartbeats
        are recent is left alone (its reported load is not overwritten); otherwise at most
        one heartbeat per engine per sixth of the timeout, in the background.
        """
        timeout = self.pool.heartbeat_timeout
        if timeout <= 0:
            return
        age = self.pool.heartbeat_age(engine_id)
        now = time.monotonic()
        if age is not None and age < timeout / 3:
            return
        if now - self._vouched_at.get(engine_id, float("-inf")) < timeout / 6:
            return
        self._vouched_at[engine_id] = now
        task = asyncio.ensure_future(self._heartbeat(engine_id, generation))
        self._vouching.add(task)
        task.add_done_callback(self._vouching.discard)

    async def _heartbeat(self, engine_id: str, generation: int) -> None:
        try:
            await self.registry.heartbeat(
                rpb.HeartbeatRequest(engine_id=engine_id, registration_generation=generation),
                timeout=self.settings.report_timeout_seconds,
            )
        except BoomerangClientError as err:  # best effort: a stale engine only costs reuse
            log.debug("heartbeat for %s after its turn failed: %s", engine_id, err)

    async def end_turn(self, record: PlanRecord, r: ReportInput, pulled: bool) -> TurnEnding:
        """Settle the claim and register D's retained blocks: one CompleteTurn, one transaction.

        Returns (the claimed lease's state, the settlement's failure, the retention, the new
        lease, the registration's failure). A decode engine the registry does not know at
        this generation is registered from its own params and the turn ended again (the
        settlement repeats as a no-op)."""
        claim = None
        if pulled:
            claim = turn_claim(record.lease_id, record.claim_id, r.handle_use.consumed)
        kept = self.retained(record, r)
        retained = kept if isinstance(kept, rpb.RegisterRetainedBlocksRequest) else None
        if claim is None and retained is None:
            return "", "", kept if isinstance(kept, Retention) else Retention.NOT_RETAINED, None, ""
        timeout = self.settings.report_timeout_seconds
        for attempt in (1, 2):
            try:
                end = await complete_turn(self.registry, record.tenant, claim, retained, timeout)
            except BoomerangClientError as err:
                if err.code in TRANSIENT_CODES:
                    raise registry_down(err) from None
                log.warning("plan %s: CompleteTurn refused: %s", record.plan_id, err)
                failed = f"CompleteTurn: {err.reason}"
                rejected = Retention.REJECTED if retained else Retention.NOT_RETAINED
                return "", failed if claim else "", rejected, None, err.reason if retained else ""
            state, settle_detail = self._settled(record, claim, end)
            if retained is None:
                return state, settle_detail, kept if isinstance(kept, Retention) else Retention.NOT_RETAINED, None, ""
            refusal = end.registration_error
            if refusal is None:
                self.vouch_for(retained.engine_id, retained.engine_generation)
                return state, settle_detail, Retention.REGISTERED if end.created else Retention.ALREADY_REGISTERED, end.lease, ""
            if refusal.code in TRANSIENT_CODES:
                raise registry_down(refusal) from None
            if attempt == 1 and refusal.reason in ("ENGINE_NOT_REGISTERED", "GENERATION_NOT_REGISTERED"):
                refused = await self.register_decode_engine(record, r.decode_params, retained)
                if refused:
                    return state, settle_detail, Retention.REJECTED, None, refused
                continue
            log.info("plan %s: registry refused the retained blocks: %s", record.plan_id, refusal)
            return state, settle_detail, Retention.REJECTED, None, refusal.reason
        raise AssertionError("unreachable: the second attempt returns")  # pragma: no cover

    def _settled(
        self, record: PlanRecord, claim: rpb.TurnClaim | None, end: CompleteTurnAnswer
    ) -> tuple[str, str]:
        """The claimed lease's state after CompleteTurn, and why settling it failed (or "")."""
        if claim is None:
            return "", ""
        err = end.claim_error
        if err is None:
            return end.claim_state, ""
        if err.code in TRANSIENT_CODES:
            raise registry_down(err) from None
        state = ""
        if err.code == "FAILED_PRECONDITION" and err.reason.startswith("LEASE_"):
            state = err.reason.removeprefix("LEASE_")  # the state the lease had already ended in
        log.warning("plan %s: settling its claim: %s", record.plan_id, err)
        settling = "consume" if claim.use == rpb.CLAIM_USE_READ else "release"
        return state, f"{settling} claim: {err.reason}"

    def retained(
        self, record: PlanRecord, r: ReportInput
    ) -> rpb.RegisterRetainedBlocksRequest | Retention:
        """D's retained blocks as the conversation's next lease (CompleteTurn's registration, its
        tenant the call's own), or why there are none.

        Without a conversation id the lease is found by the prompt that continues this one,
        which needs the prompt's tokens (a report with only a chain registers nothing then).
        """
        if not record.conversation_id and not r.prompt_len:
            return Retention.NO_CONVERSATION
        p = r.decode_params
        if p is None or not accepts_pull(p):
            return Retention.NOT_RETAINED
        assert p.remote_engine_id and p.remote_request_id and p.remote_port and p.remote_num_tokens
        known = self.pool.known(p.remote_engine_id)
        generation = p.remote_registration_generation
        if generation is None:
            generation = known.generation if known is not None else 0
        host = p.remote_host or ""
        if self.settings.remote_host_from_url and record.decode_url:
            host = urlparse(record.decode_url).hostname or host
        if r.chain is not None:
            chain = r.chain
        else:
            block_size = known.block_size if known is not None and known.block_size else self.settings.block_size
            tokens = r.token_ids or []
            chain = build_chain(tokens[: min(p.remote_num_tokens, len(tokens))], block_size, r.salt)
        if chain.num_tokens == 0:
            return Retention.NOT_RETAINED
        prompt_len = r.prompt_len if r.token_ids is not None and r.prompt_len <= chain.num_tokens else 0
        tail = prompt_len % chain.block_size
        tail_ids = (r.token_ids or [])[prompt_len - tail : prompt_len] if tail else ()
        return rpb.RegisterRetainedBlocksRequest(
            conversation_id=record.conversation_id,
            engine_id=p.remote_engine_id,
            engine_generation=generation,
            remote_request_id=p.remote_request_id,
            block_groups=[tpb.BlockIdGroup(block_ids=list(g)) for g in p.remote_block_ids or ()],
            num_tokens=chain.num_tokens,
            token_chain=chainproto.to_proto(chain),
            finish_time_unix=r.finish_time_unix,
            remote_host=host,
            remote_port=p.remote_port,
            model=record.model,
            request_id=f"report-{record.plan_id}",
            # The previous prompt's length; 0: found by conversation id only.
            prompt_tokens=prompt_len,
            prompt_tail_token_ids=tail_ids,
        )

    async def register_decode_engine(
        self, record: PlanRecord, p: KvParams | None, r: rpb.RegisterRetainedBlocksRequest
    ) -> str:
        """Register D (unknown to the registry, or at a newer generation) from its own params.

        Returns the registry's refusal reason, or "" when it registered.
        """
        assert p is not None  # a retained turn has D's params
        engine = tpb.Engine(
            engine_id=r.engine_id,
            role=tpb.ENGINE_ROLE_DECODE,
            model=record.model,
            side_channel_host=r.remote_host,
            side_channel_port=r.remote_port,
            http_base_url=record.decode_url,
            registration_generation=r.engine_generation,
            block_size=r.token_chain.block_size,
            tp_size=p.tp_size or 1,
            dcp_size=p.dcp_size or 1,
            pp_size=p.pp_size or 1,
        )
        request_id = f"report-{record.plan_id}-engine"
        request = rpb.RegisterEngineRequest(engine=engine, request_id=request_id)
        try:
            timeout = self.settings.report_timeout_seconds
            await self.registry.register_engine(request, timeout=timeout)
        except BoomerangClientError as err:
            if err.code in TRANSIENT_CODES:
                raise registry_down(err) from None
            return err.reason
        log.info("registered decode engine %s generation %d from its handle", engine.engine_id, r.engine_generation)
        return ""


ORPHAN_PROBE_DELAYS = (1.0, 4.0, 15.0)
MAX_ORPHAN_PROBES = 256
# A min_reusable_tokens no prompt can reach: a claim asked with it can only return an
# earlier claim under the same claim id (CLAIM_SQL's `prior`), never take a new one.
_NEVER = 2**62


class ClaimKeeper:
    """Background releases and orphan probes, with bounded concurrency."""

    def __init__(
        self,
        settings: RouterSettings,
        registry: RegistryClient,
        store: PlanStore,
        repo: TurnPlanRepository,
        stats: Counter[str],
    ):
        self.settings = settings
        self.registry = registry
        self.store = store
        self.repo = repo
        self.stats = stats
        self.tasks: set[asyncio.Task[Any]] = set()
        self._orphan_probes = 0

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background; its failure is logged, never raised."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background claim task failed", exc_info=task.exception())

    def give_back(self, tenant: str, lease_id: str, claim_id: str, reason: str) -> None:
        """Release a claim nobody will read, in the background (`release_with_retries`)."""
        self.spawn(self.release_with_retries(tenant, lease_id, claim_id, reason))

    async def release_with_retries(
        self, tenant: str, lease_id: str, claim_id: str, reason: str, attempts: int = 3
    ) -> bool:
        """CompleteTurn with the claim not read (and nothing registered), retried while the
        registry is unreachable; whether it was released."""
        claim = turn_claim(lease_id, claim_id, read=False, release_reason=reason)
        for attempt in range(attempts):
            try:
                timeout = self.settings.report_timeout_seconds
                end = await complete_turn(self.registry, tenant, claim, None, timeout)
                if end.claim_error is not None:
                    raise end.claim_error
                return True
            except BoomerangClientError as err:
                if err.code not in TRANSIENT_CODES:
                    log.warning("could not release claim on lease %s: %s", lease_id, err)
                    return False
                await asyncio.sleep(0.2 * 2**attempt)
        log.warning("gave up releasing claim on lease %s; it stays claimed until it expires", lease_id)
        return False

    def probe_orphan(self, claim: rpb.ClaimReuseRequest) -> None:
        """Start an orphan probe for a claim call that failed or timed out (bounded in number)."""
        if self._orphan_probes >= MAX_ORPHAN_PROBES:
            return
        self.spawn(self._counted(claim))

    async def _counted(self, claim: rpb.ClaimReuseRequest) -> None:
        self._orphan_probes += 1
        try:
            await self.orphan_probe(claim)
        finally:
            self._orphan_probes -= 1

    async def orphan_probe(self, claim: rpb.ClaimReuseRequest) -> None:
        """A timed-out claim may still commit: find it under its id and give it back.

        Only while no plan holds it: a claim id derived from a caller's request id is shared
        by that caller's retries, and a retry (here or on another replica) may have been
        handed this very claim. Plans that hand a claim out are in this router's store or
        in `turn_plans`; when neither can be checked, the claim is left to expire.
        """
        since = datetime.now(UTC) - timedelta(hours=1)
        for delay in ORPHAN_PROBE_DELAYS:
            await asyncio.sleep(delay)
            try:
                lease_id = await self.find_claim(claim)
            except BoomerangClientError:
                continue
            if lease_id is None:
                continue
            if self.store.by_claim(claim.claim_id) is not None:
                self.stats["orphan_claims_in_use"] += 1
                return
            try:
                held = await self.repo.claim_handed_out(claim.tenant, claim.conversation_id, claim.claim_id, since)
            except Exception:
                log.warning("cannot check whether claim %s is in use; leaving it", claim.claim_id, exc_info=True)
                return
            if held:
                self.stats["orphan_claims_in_use"] += 1
                return
            self.stats["orphan_claims_found"] += 1
            await self.release_with_retries(claim.tenant, lease_id, claim.claim_id, "ROUTER_CLAIM_TIMED_OUT")
            return

    async def find_claim(self, claim: rpb.ClaimReuseRequest) -> str | None:
        """The lease id an earlier `claim` claimed, if it did; never claims anything itself."""
        probe = rpb.ClaimReuseRequest()
        probe.CopyFrom(claim)
        probe.min_reusable_tokens = _NEVER
        resp = await self.registry.claim_reuse(probe, timeout=self.settings.report_timeout_seconds)
        if resp.outcome != rpb.CLAIM_OUTCOME_CLAIMED or not resp.HasField("lease"):
            return None
        return resp.lease.lease_id

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for background releases; orphan probes still sleeping are cancelled."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
