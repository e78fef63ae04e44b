"""A turn's calls to the engines: `/tokenize` on a prefill engine, the prefill request, and
the decode stream.

An engine that refuses the connection (or never answers it) never saw the request, so the next
engine gets the same request, up to ENGINE_ATTEMPTS engines (a crashed engine stays listed until its
heartbeats time out, and is marked down here meanwhile). Engine failures are the client's
errors (`ApiError`); the tokenize call's are not (the turn then recomputes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx2 as httpx

from boomerang_gateway import protocol
from boomerang_gateway.control import Plan, first_turn_params
from boomerang_gateway.engine_routing import DECODE, PREFILL, EngineRef, EngineRouting
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ApiError, ClientRequest, from_engine

log = logging.getLogger(__name__)
# Engines tried for one request when they refuse connections.
ENGINE_ATTEMPTS = 3
# The connection never opened (refused, or no answer to it in time: a stopped or overloaded
# engine whose backlog is full): the engine saw nothing, so another may take the request.
UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout)


class EngineCalls:
    """The HTTP requests a turn makes to its engines, and the engine each went to."""

    def __init__(self, http: httpx.AsyncClient, pool: EngineRouting, metrics: GatewayMetrics, sticky_prefill: bool = False):
        self.http = http
        self.pool = pool
        self.metrics = metrics
        self.sticky_prefill = sticky_prefill  # the prefill choice hashes the conversation

    def engine_for(self, role: str, planned_url: str, req: ClientRequest) -> EngineRef:
        """The engine the plan named, else the pool's choice; 503 when the model has none."""
        if planned_url:
            return self.pool.find(role, planned_url)
        engine = self.pool.choose(role, req.model, key=self._sticky_key(req) if role == PREFILL else "")
        if engine is None:
            raise ApiError(503, f"no {role} engine is available for model {req.model!r}", code="no_engine")
        return engine

    async def tokenize_on_engine(self, req: ClientRequest, timeout: float) -> list[int] | None:
        """The prompt's token ids from a prefill engine's `/tokenize`, or None."""
        engine = self.pool.choose(PREFILL, req.model)
        deadline = time.monotonic() + timeout
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

    async def prefill(
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
                refused = isinstance(exc, UNREACHED)
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
            if isinstance(exc, UNREACHED):
                self.pool.mark_down(engine.url)
            raise
        finally:
            engine.in_flight -= 1

    async def open_decode(
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
            except UNREACHED as exc:
                engine.in_flight -= 1
                self.pool.mark_down(engine.url)
                self.metrics.engine_errors.labels(DECODE, type(exc).__name__).inc()
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

    def _sticky_key(self, req: ClientRequest) -> str:
        return req.conversation_id if self.sticky_prefill else ""


def _json_body(resp: httpx.Response) -> Any:
    """A response's JSON body, or None."""
    try:
        return resp.json()
    except ValueError:
        return None
