"""ReportTurn's registry work: settle the claimed handle, register D's retained blocks.

Both in one CompleteTurn call, which the registry runs in one transaction. The
`turn_plans` row is not in that transaction: the router owns that table and writes it in
its own batches off the turn's path (repository.AuditWriter), and the registry never
touches it. Every call here is idempotent at the registry (a settlement by claim id, a
registration by the decode engine's `remote_request_id`, RegisterEngine by generation), so
a repeated report repeats them harmlessly. A registry that cannot be
reached makes the report fail with UNAVAILABLE (the caller retries); a registry that refuses
the blocks (a stale generation, a dead engine) is an outcome, recorded, not an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.resilience import TRANSIENT_CODES
from boomerang.tokenchain import build_chain
from boomerang.v1 import types_pb2 as tpb

from boomerang_router import kvparams
from boomerang_router.domain import Retention
from boomerang_router.engines import EnginePool
from boomerang_router.plan_store import PlanRecord
from boomerang_router.registry_api import DecodeEngine, Retained, RouterRegistry, TurnClaim, TurnEnd
from boomerang_router.requests import ReportInput
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

# How the registry ended a turn (`Reporter.end_turn_in_registry`): the claimed lease's state,
# why settling it failed, the retention, the new lease, and why registering the blocks failed.
TurnEnding = tuple[str, str, Retention, tpb.Lease | None, str]


def registry_down(err: BoomerangClientError) -> BoomerangError:
    """The error a caller gets when the registry could not be reached: retry later."""
    return BoomerangError(
        Code.UNAVAILABLE, "REGISTRY_UNAVAILABLE", f"the block registry did not answer ({err}); retry the call"
    )


@dataclass
class ReportResult:
    """What ReportTurn did (the servicer's answer is built from it)."""

    record: PlanRecord
    claimed_lease_state: str
    retention: Retention
    lease: tpb.Lease | None
    detail: str


async def report_each(
    report: Callable[[ReportInput], Awaitable[ReportResult]], inputs: Sequence[ReportInput | BoomerangError]
) -> list[ReportResult | BaseException]:
    """ReportTurnBatch's work: each valid report settled by `report` (ReportTurn's own path),
    all at once; each answer, or the error it alone failed with, in the inputs' order (a
    validation error passes through in its place).

    At once, not one after another: each report's CompleteTurn then reaches the registry
    together with the others, and the registry's group commit (RegistrationBatcher) settles
    them in a few transactions instead of one each. Measured on a loaded 2-core host, 64
    reports with registrations: router + registry CPU 2.0 ms a report at once against 5.3 ms
    one after another (6.7 ms as 64 ReportTurn calls), 0.09 Postgres commits a report
    against 2.3. Reports of the same plan still run one at a time (`report` serializes them
    per plan id).
    """

    async def one(item: ReportInput | BoomerangError) -> ReportResult | BaseException:
        if isinstance(item, BoomerangError):
            return item
        try:
            return await report(item)
        except Exception as exc:  # noqa: BLE001 - each report's failure is its own answer
            return exc

    return list(await asyncio.gather(*(one(item) for item in inputs)))


class Reporter:
    """The registry calls behind ReportTurn."""

    def __init__(self, settings: RouterSettings, registry: RouterRegistry, pool: EnginePool):
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.engines_registered = 0
        self.vouched = 0
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
            await self.registry.heartbeat_in_registry(engine_id, generation, timeout=self.settings.report_timeout_seconds)
            self.vouched += 1
        except BoomerangClientError as err:  # best effort: a stale engine only costs reuse
            log.debug("heartbeat for %s after its turn failed: %s", engine_id, err)

    async def end_turn_in_registry(self, record: PlanRecord, r: ReportInput, pulled: bool) -> TurnEnding:
        """Settle the claim and register D's retained blocks: one CompleteTurn, one transaction.

        Returns (the claimed lease's state, the settlement's failure, the retention, the new
        lease, the registration's failure). A decode engine the registry does not know at
        this generation is registered from its own params and the turn ended again (the
        settlement repeats as a no-op)."""
        claim = TurnClaim(record.lease_id, record.claim_id, r.handle_use.consumed) if pulled else None
        kept = self.retained(record, r)
        retained = kept if isinstance(kept, Retained) else None
        if claim is None and retained is None:
            return "", "", kept if isinstance(kept, Retention) else Retention.NOT_RETAINED, None, ""
        timeout = self.settings.report_timeout_seconds
        for attempt in (1, 2):
            try:
                end = await self.registry.complete_turn_in_registry(record.tenant, claim, retained, timeout)
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

    def _settled(self, record: PlanRecord, claim: TurnClaim | None, end: TurnEnd) -> tuple[str, str]:
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
        return state, f"{'consume' if claim.read else 'release'} claim: {err.reason}"

    def retained(self, record: PlanRecord, r: ReportInput) -> Retained | Retention:
        """D's retained blocks as the conversation's next lease, or why there are none.

        Without a conversation id the lease is found by the prompt that continues this one,
        which needs the prompt's tokens (a report with only a chain registers nothing then).
        """
        if not record.conversation_id and not r.prompt_len:
            return Retention.NO_CONVERSATION
        p = r.decode_params
        if p is None or not kvparams.accepts_pull(p):
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
        return Retained(
            tenant=record.tenant,
            conversation_id=record.conversation_id,
            engine_id=p.remote_engine_id,
            engine_generation=generation,
            remote_request_id=p.remote_request_id,
            block_groups=p.remote_block_ids or (),
            chain=chain,
            finish_time_unix=r.finish_time_unix,
            remote_host=host,
            remote_port=p.remote_port,
            model=record.model,
            request_id=f"report-{record.plan_id}",
            prompt_tokens=prompt_len,
            prompt_tail_ids=(r.token_ids or [])[prompt_len - tail : prompt_len] if tail else (),
        )

    async def register_decode_engine(self, record: PlanRecord, p: kvparams.KvParams | None, r: Retained) -> str:
        """Register D (unknown to the registry, or at a newer generation) from its own params.

        Returns the registry's refusal reason, or "" when it registered.
        """
        assert p is not None  # a retained turn has D's params
        engine = DecodeEngine(
            engine_id=r.engine_id,
            model=record.model,
            host=r.remote_host,
            port=r.remote_port,
            http_base_url=record.decode_url,
            generation=r.engine_generation,
            block_size=r.chain.block_size,
            tp_size=p.tp_size or 1,
            dcp_size=p.dcp_size or 1,
            pp_size=p.pp_size or 1,
        )
        try:
            await self.registry.register_decode_engine(
                engine, f"report-{record.plan_id}-engine", timeout=self.settings.report_timeout_seconds
            )
        except BoomerangClientError as err:
            if err.code in TRANSIENT_CODES:
                raise registry_down(err) from None
            return err.reason
        self.engines_registered += 1
        log.info("registered decode engine %s generation %d from its handle", engine.engine_id, r.engine_generation)
        return ""
