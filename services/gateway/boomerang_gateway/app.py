"""The gateway's HTTP surface (Starlette): the OpenAI endpoints, `/health`, `/metrics`.

Checks run in the order a client can act on: the key (401), the tenant's rate (429), the
body's size (413) and shape (400), the model (404); then the turn (`turn.py`). Every error is OpenAI-style JSON.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from boomerang.telemetry import annotate
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from boomerang_gateway import chunks, protocol
from boomerang_gateway.engine_routing import EngineRouting
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ApiError, ClientRequest, Kind
from boomerang_gateway.tenants import (
    AuthUnavailable,
    TenantAuth,
    TenantRateLimiter,
    retry_after_header,
)
from boomerang_gateway.turn import Turn, TurnRunner, UpstreamBroken

log = logging.getLogger(__name__)


@dataclass
class Handlers:
    """The route handlers and what they share."""

    auth: TenantAuth
    pool: EngineRouting
    runner: TurnRunner
    metrics: GatewayMetrics
    max_body_bytes: int
    limiter: TenantRateLimiter
    draining: bool = False  # set on SIGTERM/SIGINT: /health answers 503

    async def _tenant(self, request: Request) -> str:
        try:
            tenant = await self.auth.tenant_for(request.headers.get("authorization"))
        except AuthUnavailable:
            raise ApiError(503, "the API key cannot be checked right now; retry shortly", code="auth_unavailable",
                           type_="server_error") from None
        if tenant is None:
            given = bool(request.headers.get("authorization"))
            raise ApiError(
                401,
                "Incorrect API key provided." if given else "Missing API key: send Authorization: Bearer <key>.",
                code="invalid_api_key",
            )
        return tenant

    async def _body(self, request: Request) -> bytes:
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        return bytes(body)

    def _check_model(self, model: str) -> None:
        if self.pool.serves(model):
            return
        if not self.pool.models():
            raise ApiError(503, "no engines are available yet", code="no_engine", type_="server_error")
        raise ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions."""
        return await self._generate(request, Kind.CHAT)

    async def completions(self, request: Request) -> Response:
        """POST /v1/completions."""
        return await self._generate(request, Kind.COMPLETION)

    async def _generate(self, request: Request, kind: Kind) -> Response:
        endpoint = kind.value
        try:
            tenant = await self._tenant(request)
            wait = self.limiter.acquire(tenant)
            if wait:
                self.metrics.requests.labels(endpoint, "429").inc()
                return ApiError(429, f"Rate limit reached for tenant {tenant!r}; retry in {wait:.2f} s.",
                                code="rate_limit_exceeded").response(retry_after_header(wait))
            raw = await self._body(request)
            req = protocol.parse(
                kind, raw, request.headers.get(protocol.CONVERSATION_HEADER), request.headers.get(protocol.REUSE_HEADER),
                request.headers.get(protocol.SESSION_HEADER),
            )
            if req.dropped_kv_params:
                self.metrics.dropped_kv_params.inc()
            self._check_model(req.model)
            turn = await self.runner.start_turn(req, tenant)
        except ApiError as exc:
            self.metrics.requests.labels(endpoint, str(exc.status)).inc()
            return exc.response()
        annotate_turn(turn)
        if req.stream:
            self.metrics.requests.labels(endpoint, "200").inc()
            return StreamingResponse(self._stream(turn, req), media_type="text/event-stream",
                                     headers={**turn.headers, "Cache-Control": "no-cache"})
        return await self._complete(turn, req, endpoint)

    async def _stream(self, turn: Turn, req: ClientRequest) -> AsyncIterator[bytes]:
        try:
            async for chunk in turn.chunks():
                out = chunks.for_client(chunk, req, turn.cached_tokens)
                if out is not None:
                    yield chunks.sse(out)
            await turn.settle()  # the lease is committed before the client sees the end
            yield chunks.sse(chunks.DONE)
        except UpstreamBroken as exc:
            log.warning("decode stream broke: %s", exc)
            yield chunks.sse(ApiError(502, str(exc), code="engine_error", type_="upstream_error").body())
        finally:
            await turn.finish()

    async def _complete(self, turn: Turn, req: ClientRequest, endpoint: str) -> Response:
        folded = chunks.Aggregate(req, turn.capture)
        try:
            async for chunk in turn.chunks():
                folded.add(chunk)
            await turn.settle()  # the lease is committed before the client has the body
        except UpstreamBroken as exc:
            self.metrics.requests.labels(endpoint, "502").inc()
            return ApiError(502, str(exc), code="engine_error", type_="upstream_error").response(turn.headers)
        finally:
            await turn.finish()
        self.metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(folded.result(turn.cached_tokens), headers=turn.headers)

    async def models(self, request: Request) -> Response:
        """GET /v1/models."""
        try:
            await self._tenant(request)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"object": "list", "data": self.pool.models()})

    async def health(self, request: Request) -> Response:
        """GET /health: 200 while serving, 503 while draining. `models`: those it can serve now
        (a prefill and a decode engine each), the figure a load balancer's readiness reads."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "engines": self.pool.source, "models": self.pool.servable()})

    async def exposition(self, request: Request) -> Response:
        """GET /metrics: Prometheus text exposition."""
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)


def annotate_turn(turn: Turn) -> None:
    """Put the turn's plan on the current (HTTP server) span as `boomerang.*` attributes (a no-op
    when tracing is off), so a trace viewer shows a turn's decision, reason and tokens without
    opening the router's spans."""
    plan = turn.plan
    prompt = len(turn.prompt_token_ids) if turn.prompt_token_ids is not None else None
    annotate(
        tenant=turn.tenant,
        conversation=turn.req.conversation_id or None,
        decision=plan.decision,
        reason=plan.reason,
        plan_id=plan.plan_id or None,
        prompt_tokens=prompt,
        reused_tokens=plan.reused_tokens,
        recomputed_tokens=None if prompt is None else prompt - plan.reused_tokens,
        request_id=turn.request_id,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed"}.get(
        exc.status_code, str(exc.detail)
    )
    return ApiError(exc.status_code, message).response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return ApiError(500, "internal gateway error", type_="server_error").response()


def create_app(h: Handlers) -> Starlette:
    """The ASGI app."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", h.chat, methods=["POST"]),
            Route("/v1/completions", h.completions, methods=["POST"]),
            Route("/v1/models", h.models, methods=["GET"]),
            Route("/health", h.health, methods=["GET"]),
            Route("/metrics", h.exposition, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _unexpected},
    )
