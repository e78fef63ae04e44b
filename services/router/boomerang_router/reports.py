"""ReportTurn's registry work: settle the claimed handle, register D's retained blocks.

Every call here is idempotent at the registry (MarkConsumed and ReleaseClaim by claim id,
RegisterRetainedBlocks by the decode engine's `remote_request_id`, RegisterEngine by
generation), so a repeated report repeats them harmlessly. A registry that cannot be
reached makes the report fail with UNAVAILABLE (the caller retries); a registry that refuses
the blocks (a stale generation, a dead engine) is an outcome, recorded, not an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlparse

from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.resilience import TRANSIENT_CODES
from boomerang.tokenchain import build_chain
from boomerang.v1 import types_pb2 as tpb

from boomerang_router import kvparams
from boomerang_router.domain import HandleUse, Retention
from boomerang_router.plans import PlanRecord
from boomerang_router.pool import EnginePool
from boomerang_router.registry_api import DecodeEngine, Retained, RouterRegistry
from boomerang_router.requests import ReportInput
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)



def registry_down(err: BoomerangClientError) -> BoomerangError:
    """The error a caller gets when the registry could not be reached: retry later."""
    return BoomerangError(
        Code.UNAVAILABLE, "REGISTRY_UNAVAILABLE", f"the block registry did not answer ({err}); retry the call"
    )


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
            await self.registry.heartbeat(engine_id, generation, timeout=self.settings.report_timeout_seconds)
            self.vouched += 1
        except BoomerangClientError as err:  # best effort: a stale engine only costs reuse
            log.debug("heartbeat for %s after its turn failed: %s", engine_id, err)

    async def settle_handle(self, record: PlanRecord, use: HandleUse) -> tuple[str, str]:
        """MarkConsumed (read, or not known) or ReleaseClaim (never read)."""
        try:
            timeout = self.settings.report_timeout_seconds
            if use.consumed:
                state = await self.registry.mark_consumed(record.tenant, record.lease_id, record.claim_id, timeout)
                return state, ""
            state = await self.registry.release_claim(
                record.tenant, record.lease_id, record.claim_id, "PREFILL_DID_NOT_READ", timeout
            )
            return state, ""
        except BoomerangClientError as err:
            if err.code in TRANSIENT_CODES:
                raise registry_down(err) from None
            state = ""
            if err.code == "FAILED_PRECONDITION" and err.reason.startswith("LEASE_"):
                state = err.reason.removeprefix("LEASE_")  # the state the lease had already ended in
            log.warning("plan %s: settling its claim: %s", record.plan_id, err)
            return state, f"{'MarkConsumed' if use.consumed else 'ReleaseClaim'}: {err.reason}"

    async def retain(self, record: PlanRecord, r: ReportInput) -> tuple[Retention, tpb.Lease | None, str]:
        """Register D's retained blocks as the conversation's next lease.

        Without a conversation id the lease is found by the prompt that continues this one,
        which needs the prompt's tokens (a report with only a chain registers nothing then).
        """
        if not record.conversation_id and not r.prompt_len:
            return Retention.NO_CONVERSATION, None, ""
        p = r.decode_params
        if p is None or not kvparams.accepts_pull(p):
            return Retention.NOT_RETAINED, None, ""
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
            return Retention.NOT_RETAINED, None, ""
        prompt_len = r.prompt_len if r.token_ids is not None and r.prompt_len <= chain.num_tokens else 0
        tail = prompt_len % chain.block_size
        retained = Retained(
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
        for attempt in (1, 2):
            try:
                created, lease = await self.registry.register_retained(retained, timeout=self.settings.report_timeout_seconds)
                self.vouch_for(p.remote_engine_id, generation)
                return (Retention.REGISTERED if created else Retention.ALREADY_REGISTERED), lease, ""
            except BoomerangClientError as err:
                if err.code in TRANSIENT_CODES:
                    raise registry_down(err) from None
                unknown = err.reason in ("ENGINE_NOT_REGISTERED", "GENERATION_NOT_REGISTERED")
                if attempt == 1 and unknown:
                    refused = await self.register_decode_engine(record, p, generation, host, chain.block_size)
                    if refused:
                        return Retention.REJECTED, None, refused
                    continue
                log.info("plan %s: registry refused the retained blocks: %s", record.plan_id, err)
                return Retention.REJECTED, None, err.reason
        return Retention.REJECTED, None, "ENGINE_NOT_REGISTERED"  # pragma: no cover - loop returns

    async def register_decode_engine(
        self, record: PlanRecord, p: kvparams.KvParams, generation: int, host: str, block_size: int
    ) -> str:
        """Register D (unknown to the registry, or at a newer generation) from its own params.

        Returns the registry's refusal reason, or "" when it registered.
        """
        engine = DecodeEngine(
            engine_id=p.remote_engine_id or "",
            model=record.model,
            host=host,
            port=p.remote_port or 0,
            http_base_url=record.decode_url,
            generation=generation,
            block_size=block_size,
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
        log.info("registered decode engine %s generation %d from its handle", engine.engine_id, generation)
        return ""
