"""One turn, exactly as docs/vllm-contract.md describes it, from the client's request to ReportTurn.

1. Tokenize the prompt: in-process for models with local tokenizer files (`localtokens`,
   checked against D's prompt ids at the end of the turn), else on a prefill engine
   (`/tokenize`, the engine's own chat template).
2. PlanTurn (short deadline): the engines, PULL/RECOMPUTE/COLD, the `kv_transfer_params`.
3. The prefill request: max_tokens 1, not streamed, with the plan's `kv_transfer_params`.
4. The decode request: streamed, `return_token_ids`, with P's returned params
   (`remote_host` set to the host the gateway reached P at).
5. Tokens go to the client as they come; D's final `kv_transfer_params` and the token ids
   are captured; ReportTurn is sent and answered (the lease committed, bounded by
   `BOOMERANG_REPORT_COMMIT_TIMEOUT_SECONDS`) before the client's last byte — the
   non-streamed body, or the streamed `[DONE]` — so a crash after the turn loses no lease.

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

from boomerang_gateway import protocol, reuse
from boomerang_gateway.chunks import DONE, Capture, sse_data
from boomerang_gateway.control import (
    ControlPlane,
    Plan,
    Report,
    engine_plan,
    fallback,
    first_turn_params,
)
from boomerang_gateway.engines import DECODE, PREFILL, EnginePool, EngineRef
from boomerang_gateway.errors import ApiError, from_engine
from boomerang_gateway.http import httpx
from boomerang_gateway.localtokens import InProcessTokenizers
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ClientRequest
from boomerang_gateway.reuse import ReuseOutcome

log = logging.getLogger(__name__)
# Engines tried for one request when they refuse connections (a crashed engine stays listed
# until its heartbeats time out).
ENGINE_ATTEMPTS = 3


class UpstreamBroken(Exception):
    """The decode engine's stream ended abnormally after the response had started."""


@dataclass
class TurnConfig:
    """The knobs a turn needs."""

    tokenize_timeout: float
    rewrite_remote_host: bool = True
    engine_hook: bool = False  # the engines plan and register themselves (BOOMERANG_ENGINE_HOOK)
    sticky_prefill: bool = False  # the gateway's own prefill choice hashes the conversation (BOOMERANG_STICKY_PREFILL)


@dataclass
class Turn:
    """A turn whose decode stream is open: headers are known, chunks are to come."""

    req: ClientRequest
    tenant: str
    plan: Plan
    handle_use: str
    prefill: EngineRef
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
    tokenized_locally: bool = False  # prompt_token_ids came from the in-process tokenizer

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
                    self._report()
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk and "choices" not in chunk:
                    raise UpstreamBroken(str(chunk["error"]))
                first = self.capture.first_token_at is None
                self.capture.observe(chunk)
                if first and self.capture.first_token_at is not None:
                    self.runner.metrics.ttft_seconds.labels(self.plan.decision).observe(
                        self.capture.first_token_at - self.started
                    )
                yield chunk
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
        self._report()

    async def settle(self) -> None:
        """Report the finished turn and wait (bounded) until the router has answered it.

        Called before the client's last byte: the registry then holds the lease the next
        turn pulls, whatever crashes after. The wait is on the end of the turn, never on
        its first token; a control plane that does not answer in time costs nothing more
        (the report goes on in the background) and is counted.
        """
        self._report()
        outcome, waited = await self.runner.control.settle(self.report_task)
        if outcome == "none":
            return
        self.timings["report"] = waited
        self.runner.metrics.end_of_turn_seconds.observe(waited)
        self.runner.metrics.end_of_turn_reports.labels(outcome).inc()
        if outcome != "committed":
            log.warning("turn %s ended before its report was answered (%s after %.3f s)",
                        self.plan.plan_id, outcome, waited)

    def _report(self) -> None:
        """Send ReportTurn in the background, once."""
        if self.reported:
            return
        self.reported = True
        params = self.capture.kv_transfer_params if self.capture.finish_reason else None
        prompt = self.capture.prompt_token_ids or self.prompt_token_ids or []
        if self.tokenized_locally and self.prompt_token_ids and self.runner.local is not None:
            self.runner.local.verify(self.req.model, self.prompt_token_ids, self.capture.prompt_token_ids)
        self.report_task = self.runner.control.report_later(
            Report(
                tenant=self.tenant,
                plan_id=self.plan.plan_id,
                conversation_id=self.req.conversation_id,
                handle_use=self.handle_use,
                decode_kv_transfer_params=params if prompt else None,
                prompt_token_ids=prompt,
                output_token_ids=self.capture.output_token_ids,
                finish_time_unix=self.capture.finished_at or time.time(),
                delivered_tokens=self.reuse.delivered if self.reuse is not None else None,
                cache_salt=self.req.cache_salt,
            )
        )


class TurnRunner:
    """Starts turns: everything up to D's first response byte."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        pool: EnginePool,
        control: ControlPlane,
        metrics: GatewayMetrics,
        config: TurnConfig,
        local: InProcessTokenizers | None = None,
    ):
        self.local = local
        self.http = http
        self.pool = pool
        self.control = control
        self.metrics = metrics
        self.config = config

    async def begin(self, req: ClientRequest, tenant: str) -> Turn:
        """Plan, prefill, and open the decode stream; ApiError for the client otherwise."""
        started = time.monotonic()
        timings: dict[str, float] = {}
        request_id = uuid.uuid4().hex
        plan, tokens, local = await self._plan(req, tenant, timings)
        self.metrics.turns.labels(plan.decision, plan.reason).inc()
        if tokens:
            self.metrics.prompt_tokens.inc(len(tokens))
        self.metrics.reused_tokens.inc(plan.reused_tokens)
        planned = plan.reused_tokens
        prefill = self._engine(PREFILL, plan.prefill_url, req.model, self._sticky_key(req))
        handle_use = "READ"
        t = time.monotonic()
        try:
            p_params, prefill, handle_use, p_body = await self._prefill(req, plan, prefill, request_id)
        except ApiError as exc:
            self._report_failed(req, tenant, plan, getattr(exc, "handle_use", "UNKNOWN"))
            raise
        timings["prefill"] = time.monotonic() - t
        outcome = reuse.outcome(plan.decision, plan.reason, len(tokens) if tokens else reuse.prompt_tokens_of(p_body),
                                planned, reuse.delivered_by_prefill(p_body))
        self.metrics.observe_reuse(outcome)
        self.metrics.stage_seconds.labels("prefill").observe(timings["prefill"])
        if self.config.rewrite_remote_host:
            p_params = protocol.rewrite_remote_host(p_params, prefill.url)
        decode = self._engine(DECODE, plan.decode_url, req.model)
        try:
            response, decode = await self._open_decode(req, p_params, decode, request_id)
        except ApiError:
            self._report_failed(req, tenant, plan, handle_use)
            raise
        self.metrics.in_flight.inc()
        return Turn(req, tenant, plan, handle_use, prefill, decode, response, started, timings, request_id, tokens, self,
                    reuse=outcome, tokenized_locally=local)

    # -- steps 1 and 2: Boomerang's, never fatal ---------------------------------------------

    async def _plan(
        self, req: ClientRequest, tenant: str, timings: dict[str, float]
    ) -> tuple[Plan, list[int] | None, bool]:
        """The plan, the prompt's ids, and whether they were tokenized in-process."""
        tokens, local = req.prompt_token_ids, False
        if not req.reuse:
            return fallback("", "REUSE_OFF"), tokens, local
        if self.config.engine_hook:
            return engine_plan(req.conversation_id, tenant), tokens, local
        if self.control.router is None:
            return fallback(req.conversation_id, "ROUTER_NOT_CONFIGURED"), tokens, local
        if not self.control.available():
            self.metrics.fallbacks.labels("router_backoff").inc()
            return fallback(req.conversation_id, "CONTROL_PLANE_DEGRADED"), tokens, local
        if tokens is None:
            t = time.monotonic()
            if self.local is not None and self.local.serves(req.model):
                tokens = await self.local.ids(req)
                local = tokens is not None
            if tokens is None:
                tokens = await self._tokenize(req)
            timings["tokenize"] = time.monotonic() - t
            self.metrics.stage_seconds.labels("tokenize").observe(timings["tokenize"])
            if tokens is None:
                self.metrics.fallbacks.labels("tokenize").inc()
                return fallback(req.conversation_id, "TOKENIZE_FAILED"), None, local
        t = time.monotonic()
        plan = await self.control.plan(tenant, req.conversation_id, req.model, tokens, timings, req.cache_salt)
        timings["plan"] = time.monotonic() - t - timings.get("report_wait", 0.0)
        self.metrics.stage_seconds.labels("plan").observe(timings["plan"])
        if plan is None:
            self.metrics.fallbacks.labels("router").inc()
            return fallback(req.conversation_id, "CONTROL_PLANE_DEGRADED"), tokens, local
        return plan, tokens, local

    async def _tokenize(self, req: ClientRequest) -> list[int] | None:
        engine = self.pool.choose(PREFILL, req.model)
        deadline = time.monotonic() + self.config.tokenize_timeout
        tokens, tried = None, set()
        for _ in range(ENGINE_ATTEMPTS):
            if engine is None:
                return None
            tried.add(engine.url)
            try:
                resp = await self.http.post(engine.url + "/tokenize", json=protocol.tokenize_body(req),
                                            timeout=max(0.01, deadline - time.monotonic()))
                if resp.status_code != 200:
                    log.warning("tokenize on %s: HTTP %d", engine.url, resp.status_code)
                    return None
                tokens = resp.json().get("tokens")
                break
            except httpx.ConnectError as exc:
                log.warning("tokenize on %s: cannot connect: %r", engine.url, exc)
                self.pool.mark_down(engine.url)
                engine = self.pool.choose(PREFILL, req.model, avoid=tried)
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.warning("tokenize on %s failed: %r", engine.url, exc)
                return None
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def _sticky_key(self, req: ClientRequest) -> str:
        return req.conversation_id if self.config.sticky_prefill else ""

    def _engine(self, role: str, planned_url: str, model: str, key: str = "") -> EngineRef:
        if planned_url:
            return self.pool.find(role, planned_url)
        engine = self.pool.choose(role, model, key=key)
        if engine is None:
            raise ApiError(503, f"no {role} engine is available for model {model!r}", code="no_engine")
        return engine

    def _report_failed(self, req: ClientRequest, tenant: str, plan: Plan, handle_use: str) -> None:
        """A turn that never reached decoding still reports, so its claim is settled."""
        self.control.report_later(
            Report(tenant, plan.plan_id, req.conversation_id, handle_use, None, [], [], time.time(),
                   cache_salt=req.cache_salt)
        )

    # -- steps 3 and 4: the engines ----------------------------------------------------------

    async def _prefill(
        self, req: ClientRequest, plan: Plan, engine: EngineRef, request_id: str
    ) -> tuple[dict[str, Any] | None, EngineRef, str, Any]:
        """P's returned kv_transfer_params, the engine used, what became of the handle, and P's
        response body.

        An engine that refuses the connection never saw the request, so the next engine gets
        the same params (a pull's handle is still unread), up to `ENGINE_ATTEMPTS` engines.
        Any other failure may have read the handle: one more try, computing everything.
        """
        handle_use, params, tried, recomputed = "READ", plan.kv_transfer_params, {engine.url}, False
        for _ in range(ENGINE_ATTEMPTS):
            try:
                resp = await self._post_prefill(engine, req, params, request_id)
            except httpx.HTTPError as exc:
                refused = isinstance(exc, httpx.ConnectError)
                status = 503 if refused else 504 if isinstance(exc, httpx.TimeoutException) else 502
                error = ApiError(status, f"prefill engine unreachable: {exc!r}", code="engine_unavailable",
                                 type_="upstream_error")
                failed_use = "NOT_READ" if refused else "UNKNOWN"
            else:
                if resp.status_code == 200:
                    body = _json_body(resp)
                    kv = body.get("kv_transfer_params") if isinstance(body, dict) else None
                    return (kv if isinstance(kv, dict) else None), engine, handle_use, body
                self.metrics.engine_errors.labels(PREFILL, f"http_{resp.status_code}").inc()
                error = from_engine("prefill", resp.status_code, resp.content)
                if resp.status_code < 500:
                    # The engine refused the request before running it; a retry would not help.
                    error.handle_use = "NOT_READ" if handle_use == "READ" else handle_use  # type: ignore[attr-defined]
                    raise error
                failed_use = "UNKNOWN"
            if failed_use == "UNKNOWN":
                if recomputed:
                    break
                recomputed, params = True, first_turn_params()
                if plan.decision == "PULL":
                    handle_use = "UNKNOWN"
                    plan.decision, plan.reason, plan.reused_tokens = "RECOMPUTE", "PREFILL_RETRY", 0
            other = self.pool.choose(PREFILL, req.model, avoid=tried, key=self._sticky_key(req))
            if other is None:
                if failed_use == "NOT_READ":
                    break
                other = engine  # a 5xx on the only engine: try it once more, computing everything
            engine = other
            tried.add(engine.url)
        error.handle_use = "NOT_READ" if handle_use == "READ" and plan.decision == "PULL" else handle_use  # type: ignore[attr-defined]
        raise error

    async def _post_prefill(
        self, engine: EngineRef, req: ClientRequest, params: dict[str, Any], request_id: str
    ) -> httpx.Response:
        engine.in_flight += 1
        try:
            return await self.http.post(engine.url + req.kind.path, json=protocol.prefill_body(req, params),
                                        headers={"X-Request-Id": request_id})
        except httpx.HTTPError as exc:
            self.metrics.engine_errors.labels(PREFILL, type(exc).__name__).inc()
            log.warning("prefill on %s failed: %r", engine.url, exc)
            if isinstance(exc, httpx.ConnectError):
                self.pool.mark_down(engine.url)
            raise
        finally:
            engine.in_flight -= 1

    async def _open_decode(
        self, req: ClientRequest, params: dict[str, Any] | None, engine: EngineRef, request_id: str
    ) -> tuple[httpx.Response, EngineRef]:
        """D's streaming response; an engine that refuses the connection is replaced by
        another (nothing reached it, so P's blocks are still unread), up to `ENGINE_ATTEMPTS`."""
        body = protocol.decode_body(req, params)
        tried = {engine.url}
        while True:
            engine.in_flight += 1
            try:
                resp = await self.http.send(
                    self.http.build_request(
                        "POST", engine.url + req.kind.path, json=body, headers={"X-Request-Id": request_id}
                    ),
                    stream=True,
                )
            except httpx.ConnectError as exc:
                engine.in_flight -= 1
                self.pool.mark_down(engine.url)
                self.metrics.engine_errors.labels(DECODE, "ConnectError").inc()
                log.warning("decode on %s: cannot connect: %r", engine.url, exc)
                other = self.pool.choose(DECODE, req.model, avoid=tried)
                if other is None or len(tried) >= ENGINE_ATTEMPTS:
                    raise ApiError(503, f"decode engine unreachable: {exc!r}", code="engine_unavailable",
                                   type_="upstream_error") from None
                engine = other
                tried.add(engine.url)
                continue
            except httpx.HTTPError as exc:
                engine.in_flight -= 1
                self.metrics.engine_errors.labels(DECODE, type(exc).__name__).inc()
                status = 504 if isinstance(exc, httpx.TimeoutException) else 502
                raise ApiError(status, f"decode engine failed: {exc!r}", code="engine_error",
                               type_="upstream_error") from None
            if resp.status_code != 200:
                engine.in_flight -= 1
                raw = await resp.aread()
                await resp.aclose()
                self.metrics.engine_errors.labels(DECODE, f"http_{resp.status_code}").inc()
                raise from_engine("decode", resp.status_code, raw)
            return resp, engine


def _json_body(resp: httpx.Response) -> Any:
    """A response's JSON body, or None."""
    try:
        return resp.json()
    except ValueError:
        return None
