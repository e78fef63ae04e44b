"""One turn, exactly as docs/vllm-contract.md describes it, from the client's request to ReportTurn.

The client's key, rate, body and model are checked first (`app.py`); then
`TurnRunner.start_turn` runs steps 1 to 4 (the engine calls in `engine_routing.py`,
the router's in `control.py`) and `Turn` steps 5 and 6.

1. Tokenize the prompt: in-process for models with local tokenizer files (`local_tokenize`,
   checked against D's prompt ids at the end of the turn), else on a prefill engine
   (`/tokenize`, the engine's own chat template).
2. PlanTurn (short deadline): the engines, PULL/RECOMPUTE/COLD, the `kv_transfer_params`.
3. The prefill request: max_tokens 1, not streamed, with the plan's `kv_transfer_params`.
4. The decode request: streamed, `return_token_ids`, with P's returned params
   (`remote_host` set to the host the gateway reached P at). A PREFILL_ON_DECODE plan skips
   step 3: the decode engine that holds the history gets the request with no
   `kv_transfer_params` and prefills the new tokens over its own prefix cache.
5. Tokens go to the client as they come; D's final `kv_transfer_params` and the token ids
   are captured.
6. ReportTurn is sent and answered (the lease committed, bounded by
   `BOOMERANG_REPORT_COMMIT_TIMEOUT_SECONDS`) before the client's last byte — the
   non-streamed body, or the streamed `[DONE]` — so a crash after the turn loses no lease.
   It carries the times the router learns its predictions from: the prefill (P's request,
   or D's time to first token) and D's mean gap between output tokens.

Steps 1 and 2 are Boomerang's; when either fails or is late the turn is a plain
prefill→decode (recompute). Engine failures are the client's errors, with one retry on
another engine when nothing reached the first one (or it failed with a 5xx).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
from boomerang.leasekeys import LeaseSummary, conversation_key

from boomerang_gateway import protocol
from boomerang_gateway.chunks import DONE, Capture, lift_prompt_ids, sse_data
from boomerang_gateway.control import (
    ControlPlane,
    Plan,
    Report,
    ReuseOutcome,
    delivered_by_prefill,
    engine_plan,
    fallback,
    prompt_tokens_of,
    reuse_outcome,
)
from boomerang_gateway.engine_routing import DECODE, PREFILL, EngineCalls, EngineRef
from boomerang_gateway.local_tokenize import InProcessTokenizers
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ApiError, ClientRequest, is_first_turn
from boomerang_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


class UpstreamBroken(Exception):
    """The decode engine's stream ended abnormally after the response had started."""


@dataclass
class Turn:
    """A turn whose decode stream is open: headers are known, chunks are to come."""

    req: ClientRequest
    tenant: str
    plan: Plan
    handle_use: str
    decode: EngineRef
    response: httpx.Response
    started: float
    timings: dict[str, float]
    request_id: str
    prompt_token_ids: list[int] | None
    runner: TurnRunner
    capture: Capture = field(default_factory=Capture)
    finished: bool = False
    reported: bool = False
    report_task: asyncio.Task[str] | None = None
    reuse: ReuseOutcome | None = None  # set once the prefill engine has answered
    # A turn the lease summary ruled out: its plan, started at D's first chunk (its prompt ids).
    plan_after: asyncio.Task[Plan | None] | None = None
    tokenized_locally: bool = False  # prompt_token_ids came from the in-process tokenizer
    decode_sent: float = 0.0  # monotonic time the decode request left (after P's prefill, or D's own)

    @property
    def cached_tokens(self) -> int:
        """The prompt tokens not recomputed, for `usage.prompt_tokens_details.cached_tokens`."""
        return self.reuse.cached_tokens if self.reuse is not None else 0

    @property
    def headers(self) -> dict[str, str]:
        """The Boomerang response headers."""
        out = {
            "X-Boomerang-Plan": self.plan.decision,
            "X-Boomerang-Reason": self.plan.reason,
            "X-Boomerang-Reused-Tokens": str(self.plan.reused_tokens),
            "X-Request-Id": self.request_id,
            "Server-Timing": ", ".join(f"{k};dur={v * 1000:.2f}" for k, v in self.timings.items()),
        }
        if self.plan.plan_id:
            out["X-Boomerang-Plan-Id"] = self.plan.plan_id
        return out

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """D's stream chunks, parsed and captured, until `[DONE]`."""
        try:
            async for data in sse_data(self.response):
                if data.strip() == DONE:
                    # Report now, before the client has `[DONE]` and can send its next turn.
                    self._report_once()
                    return
                # The prompt ids the client did not ask for stay text until the report reads them.
                data, prompt_ids = (data, None) if self.req.wants_token_ids else lift_prompt_ids(data)
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk and "choices" not in chunk:
                    raise UpstreamBroken(str(chunk["error"]))
                first = self.capture.first_token_at is None
                self.capture.observe(chunk, prompt_ids)
                if first and self.capture.first_token_at is not None:
                    self.runner.metrics.ttft_seconds.labels(self.plan.decision).observe(
                        self.capture.first_token_at - self.started
                    )
                yield chunk
                if (self.plan.planned_after and self.plan_after is None and self.capture.first_token_at is not None
                        and self.capture.has_prompt_ids):
                    # Once the first token is out (not at D's first chunk, which may be the role
                    # alone), beside the decode: the report needs its plan id soon, or the
                    # conversation's next turn, arriving at once, waits for it.
                    self.plan_after = self.runner.plan_after(self.req, self.tenant, self.capture)
        except httpx.HTTPError as exc:
            self.runner.metrics.engine_errors.labels(DECODE, "stream").inc()
            raise UpstreamBroken(f"decode engine stream failed: {exc!r}") from exc
        if self.capture.finish_reason is None:
            raise UpstreamBroken("decode engine stream ended before the turn finished")

    async def finish(self) -> None:
        """Close D's stream and make sure the turn is reported (idempotent)."""
        if self.finished:
            return
        self.finished = True
        self.decode.in_flight -= 1
        self.runner.metrics.in_flight.dec()
        await self.response.aclose()
        self._report_once()

    async def settle(self) -> None:
        """Report the finished turn and wait (bounded) until the router has answered it.

        Called before the client's last byte: the registry then holds the lease the next
        turn pulls, whatever crashes after. The wait is on the end of the turn, never on
        its first token; a control plane that does not answer in time costs nothing more
        (the report goes on in the background) and is counted.
        """
        self._report_once()
        outcome, waited = await self.runner.control.wait_for_report(self.report_task)
        if outcome == "none":
            return
        self.timings["report"] = waited
        self.runner.metrics.end_of_turn_seconds.observe(waited)
        self.runner.metrics.end_of_turn_reports.labels(outcome).inc()
        if outcome != "committed":
            log.warning("turn %s ended before its report was answered (%s after %.3f s)",
                        self.plan.plan_id, outcome, waited)

    def _report_once(self) -> None:
        """Send ReportTurn in the background, once."""
        if self.reported:
            return
        self.reported = True
        params = self.capture.kv_transfer_params if self.capture.finish_reason else None
        prompt = self.capture.prompt_token_ids or self.prompt_token_ids or []
        on_decode = self.plan.decision == "PREFILL_ON_DECODE"
        delivered = self.reuse.delivered if self.reuse is not None else None
        if on_decode:  # D's own count of what its prefix cache served, from the stream's usage
            delivered = delivered_by_prefill({"usage": self.capture.usage})
        if self.tokenized_locally and self.prompt_token_ids and self.runner.local is not None:
            self.runner.local.verify(self.req.model, self.prompt_token_ids, self.capture.prompt_token_ids)
        if self.plan.planned_after and not (params and prompt):
            # Nothing to register (the client went away): the report only settles the plan.
            if self.plan_after is not None:
                self.runner.control.send_report_later(Report(
                    self.tenant, "", self.req.conversation_id, "NOT_READ",
                    background_plan=self.plan_after,
                ))
            return
        if self.plan.planned_after and self.capture.prompt_token_ids and self.runner.local is not None:
            self.runner.local.remember(self.req, self.capture.prompt_token_ids)
        if self.plan.planned_after and self.plan_after is None:
            self.plan_after = self.runner.plan_after(self.req, self.tenant, self.capture)
        summary = self.runner.summary
        if summary is not None and params and self.req.conversation_id:
            # This turn's lease is about to be registered: its next turn may pull, whatever the
            # registry's stream has said yet.
            summary.add([conversation_key(self.tenant, self.req.conversation_id)])
        first = self.capture.first_token_at  # D's time to first token, from the decode request sent
        d_first_token = first - self.decode_sent if first is not None else None
        self.report_task = self.runner.control.send_report_later(
            Report(
                tenant=self.tenant,
                plan_id=self.plan.plan_id,
                conversation_id=self.req.conversation_id,
                handle_use=self.handle_use,
                decode_kv_transfer_params=params if prompt else None,
                prompt_token_ids=prompt,
                output_token_ids=self.capture.output_token_ids,
                finish_time_unix=self.capture.finished_at or time.time(),
                delivered_tokens=delivered,
                cache_salt=self.req.cache_salt,
                # The prefill's time: D's time to first token when it prefilled, else P's request.
                prefill_seconds=d_first_token if on_decode else self.timings.get("prefill"),
                inter_token_seconds=self._inter_token_seconds(),
                decode_first_token_seconds=None if on_decode else d_first_token,
                background_plan=self.plan_after,
            )
        )

    def _inter_token_seconds(self) -> float | None:
        """D's mean gap between output tokens in this turn (None under two tokens)."""
        c = self.capture
        if c.first_token_at is None or c.last_token_at is None or len(c.output_token_ids) < 2:
            return None
        return (c.last_token_at - c.first_token_at) / (len(c.output_token_ids) - 1)


class TurnRunner:
    """Starts turns: everything up to D's first response byte."""

    def __init__(
        self,
        engines: EngineCalls,
        control: ControlPlane,
        metrics: GatewayMetrics,
        settings: GatewaySettings,
        local: InProcessTokenizers | None = None,
        summary: LeaseSummary | None = None,
    ):
        self.engines = engines
        self.control = control
        self.metrics = metrics
        self.settings = settings
        self.local = local
        self.summary = summary

    async def start_turn(self, req: ClientRequest, tenant: str) -> Turn:
        """Tokenize → plan → prefill → open the decode stream; ApiError for the client otherwise.

        The client is authenticated and its request checked before (`app.py`); the turn
        streams and completes after, on the `Turn` returned (`chunks`, `settle`)."""
        started, timings, request_id = time.monotonic(), dict[str, float](), uuid.uuid4().hex
        plan, tokens, local = await self._plan(req, tenant, timings)
        self._count_plan(plan, tokens)
        if plan.decision == "PREFILL_ON_DECODE":
            # D holds the history: it prefills the new tokens itself, no prefill engine, no params.
            params, handle_use = None, "NOT_READ"
            reused = reuse_outcome(plan.decision, plan.reason, len(tokens or ()),
                                   plan.reused_tokens, None)
        else:
            params, handle_use, reused = await self._prefill(req, tenant, plan, tokens, request_id,
                                                             timings)
        sent = time.monotonic()
        response, decode = await self._open_decode(req, tenant, plan, params, handle_use,
                                                   request_id)
        self.metrics.in_flight.inc()
        return Turn(req, tenant, plan, handle_use, decode, response, started, timings, request_id,
                    tokens, self, reuse=reused, tokenized_locally=local, decode_sent=sent)

    # -- tokenize and plan: Boomerang's, never fatal -------------------------------------------

    async def _plan(
        self, req: ClientRequest, tenant: str, timings: dict[str, float]
    ) -> tuple[Plan, list[int] | None, bool]:
        """The plan, the prompt's ids, and whether they were tokenized in-process."""
        tokens = req.prompt_token_ids
        plan = self._plan_without_router(req, tenant)
        if plan is not None:
            return plan, tokens, False
        local = False
        ruled_out = self._ruled_out(req, tenant)
        if ruled_out is not None:
            return ruled_out, tokens, False
        if tokens is None:
            tokens, local = await self._tokenize(req, timings)
            if tokens is None:
                self.metrics.fallbacks.labels("tokenize").inc()
                return fallback(req.conversation_id, "TOKENIZE_FAILED"), None, local
        return await self._ask_router(req, tenant, tokens, timings), tokens, local

    def _plan_without_router(self, req: ClientRequest, tenant: str) -> Plan | None:
        """The plan when the router is not asked: reuse off, the engines' hook plans, no
        router configured, or backing off after its failures; None: ask it."""
        if not req.reuse:
            return fallback("", "REUSE_OFF")
        if self.settings.engine_hook:
            return engine_plan(req.conversation_id, tenant)
        if self.control.router is None:
            return fallback(req.conversation_id, "ROUTER_NOT_CONFIGURED")
        if not self.control.available():
            self.metrics.fallbacks.labels("router_backoff").inc()
            return fallback(req.conversation_id, "CONTROL_PLANE_DEGRADED")
        return None

    def _ruled_out(self, req: ClientRequest, tenant: str) -> Plan | None:
        """A COLD plan at once when the turn surely has no lease to continue (its router plan goes
        on beside the turn); None: plan as usual.

        With a conversation id, the live-lease summary says. Without one, a plan pulls only a
        lease whose previous prompt the new one continues, strictly longer (the registry's
        continuation rule): the continuation then holds that turn's output. A chat without an
        assistant message holds none, so it continues nothing."""
        if self.summary is None:
            return None
        if not req.conversation_id:
            if not is_first_turn(req):
                return None
            self.metrics.lease_summary.labels("first_turn").inc()
        elif not self.summary.ready:
            self.metrics.lease_summary.labels("unknown").inc()
            return None
        elif self.summary.may_have_conversation(tenant, req.conversation_id):
            self.metrics.lease_summary.labels("maybe").inc()
            return None
        else:
            self.metrics.lease_summary.labels("ruled_out").inc()
        return Plan("COLD", "NO_LIVE_LEASE", planned_after=True)

    def plan_after(self, req: ClientRequest, tenant: str, capture: Capture) -> asyncio.Task[Plan | None]:
        """The router's plan of a turn that ran without one, made beside its decode: its id for the
        report (which registers the lease its next turn pulls). It claims nothing; what it would
        have pulled is a wrong "no" (counted)."""
        async def plan() -> Plan | None:
            tokens = capture.prompt_token_ids or req.prompt_token_ids
            if not tokens:
                tokens, _ = await self._tokenize(req, {})
            if not tokens:
                return None
            planned = await self.control.ask_router_for_plan(tenant, req.conversation_id, req.model, tokens, None,
                                                             req.cache_salt, turn_started=True)
            if planned is not None and planned.reason == "TURN_STARTED":
                self.metrics.lease_summary_false_no.inc()
            return planned
        return asyncio.ensure_future(plan())

    async def _tokenize(self, req: ClientRequest, timings: dict[str, float]) -> tuple[list[int] | None, bool]:
        """The prompt's ids, in-process where the model's tokenizer is local (and whether they
        were), else from a prefill engine's `/tokenize`; None when neither could."""
        t = time.monotonic()
        tokens = None
        if self.local is not None and self.local.serves(req.model):
            tokens = await self.local.ids(req)
        local = tokens is not None
        if tokens is None:
            timeout = self.settings.tokenize_timeout_seconds
            tokens = await self.engines.tokenize_on_engine(req, timeout)
        timings["tokenize"] = time.monotonic() - t
        self.metrics.stage_seconds.labels("tokenize").observe(timings["tokenize"])
        return tokens, local

    async def _ask_router(self, req: ClientRequest, tenant: str, tokens: list[int], timings: dict[str, float]) -> Plan:
        """PlanTurn's plan, or a recompute when the router failed or was late."""
        t = time.monotonic()
        plan = await self.control.ask_router_for_plan(tenant, req.conversation_id, req.model, tokens, timings,
                                                      req.cache_salt)
        timings["plan"] = time.monotonic() - t - timings.get("report_wait", 0.0)
        self.metrics.stage_seconds.labels("plan").observe(timings["plan"])
        if plan is None:
            self.metrics.fallbacks.labels("router").inc()
            return fallback(req.conversation_id, "CONTROL_PLANE_DEGRADED")
        return plan

    def _count_plan(self, plan: Plan, tokens: list[int] | None) -> None:
        self.metrics.turns.labels(plan.decision, plan.reason).inc()
        if tokens:
            self.metrics.prompt_tokens.inc(len(tokens))
        self.metrics.reused_tokens.inc(plan.reused_tokens)

    # -- prefill and decode: the engines' ------------------------------------------------------

    async def _prefill(
        self, req: ClientRequest, tenant: str, plan: Plan, tokens: list[int] | None, request_id: str,
        timings: dict[str, float],
    ) -> tuple[dict[str, Any] | None, str, ReuseOutcome]:
        """P's params for D (their `remote_host` the host P was reached at), what became of the
        handle, and the reuse P delivered; a failed prefill still reports."""
        planned = plan.reused_tokens  # before a retry on another engine may take the reuse away
        engine = self.engines.engine_for(PREFILL, plan.prefill_url, req)
        t = time.monotonic()
        try:
            params, engine, handle_use, body = await self.engines.prefill(req, plan, engine, request_id)
        except ApiError as exc:
            self._report_unfinished(req, tenant, plan, getattr(exc, "handle_use", "UNKNOWN"))
            raise
        timings["prefill"] = time.monotonic() - t
        prompt = len(tokens) if tokens else prompt_tokens_of(body)
        delivered = delivered_by_prefill(body)
        outcome = reuse_outcome(plan.decision, plan.reason, prompt, planned, delivered)
        self.metrics.observe_reuse(outcome)
        self.metrics.stage_seconds.labels("prefill").observe(timings["prefill"])
        if self.settings.rewrite_remote_host:
            params = protocol.rewrite_remote_host(params, engine.url)
        return params, handle_use, outcome

    async def _open_decode(
        self, req: ClientRequest, tenant: str, plan: Plan, params: dict[str, Any] | None, handle_use: str,
        request_id: str,
    ) -> tuple[httpx.Response, EngineRef]:
        """D's streaming response and its engine; a decode that never opened still reports."""
        engine = self.engines.engine_for(DECODE, plan.decode_url, req)
        try:
            return await self.engines.open_decode(req, params, engine, request_id)
        except ApiError:
            self._report_unfinished(req, tenant, plan, handle_use)
            raise

    def _report_unfinished(self, req: ClientRequest, tenant: str, plan: Plan, handle_use: str) -> None:
        """A turn that never reached decoding still reports, so its claim is settled."""
        self.control.send_report_later(
            Report(tenant, plan.plan_id, req.conversation_id, handle_use, cache_salt=req.cache_salt)
        )
