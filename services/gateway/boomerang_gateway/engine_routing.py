"""The gateway's engines: its choice over the shared engine table (which serve which model,
and a fallback), and a turn's calls to the engine chosen.

The router picks the engines for a planned turn. The gateway still needs its own view to
tokenize before the plan, to know which models exist (404 for the rest, `GET /v1/models`),
and to keep serving when the router is down. Which engines exist, and which may serve, is
`boomerang_server.enginepool`'s, shared with the router: static flags (`--prefill`, `--decode`:
`URL` or `NAME=URL`) or the block registry's `ListEngines` (a refresh that fails keeps the
last good view; dead engines, and engines without an HTTP base URL, are left out).

The gateway adds:
- static engines' models and health, from each one's `/v1/models` (probed every refresh);
  engines that answer are vouched for in the registry (a heartbeat on their behalf, see
  `liveness`), so idle engines without the hook keep their leases;
- where a model has no registry engine with a fresh heartbeat, its stale ones: heartbeats
  also stop when the registry or its database was down, not only when an engine died, and
  a dead one is refused and skipped per request rather than failing every request;
- its choice: the least busy by its own in-flight count, or a conversation's hash;
- a turn's calls to the engines (`EngineCalls`): `/tokenize` on a prefill engine, the
  prefill request, and the decode stream. An engine that refuses the connection (or never
  answers it) never saw the request, so the next engine gets the same request, up to
  ENGINE_ATTEMPTS engines (a crashed engine stays listed until its heartbeats time out, and
  is marked down here meanwhile). Engine failures are the client's errors (`ApiError`); the
  tokenize call's are not (the turn then recomputes).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import xxhash
from boomerang.clients.registry import RegistryClient
from boomerang_server.enginepool import (
    DOWN_SECONDS,
    HEALTH_CHECK_FAILED,
    HEARTBEAT_STALE,
    EngineTable,
    PoolEntry,
    RegistryRefresher,
    Role,
    parse_static,
)

from boomerang_gateway import protocol
from boomerang_gateway.control import Plan, first_turn_params
from boomerang_gateway.liveness import Voucher
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ApiError, ClientRequest, from_engine

log = logging.getLogger(__name__)

PREFILL, DECODE = "prefill", "decode"
_NAME = {Role.PREFILL: PREFILL, Role.DECODE: DECODE}
# Engines tried for one request when they refuse connections.
ENGINE_ATTEMPTS = 3
# The connection never opened (refused, or no answer to it in time: a stopped or overloaded
# engine whose backlog is full): the engine saw nothing, so another may take the request.
UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass
class EngineRef:
    """One engine as the gateway sends to it: one per role and URL, kept across refreshes."""

    url: str
    role: str
    engine_id: str = ""
    models: tuple[str, ...] = ()
    healthy: bool = True
    in_flight: int = 0


class EngineRouting:
    """Engines and models, refreshed in the background."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        prefill_engines: list[str],
        decode_engines: list[str],
        registry: Callable[[], RegistryClient] | None,
        refresh_seconds: float,
        heartbeat_timeout: float = 30.0,
        voucher: Voucher | None = None,
    ):
        self.http = http
        self.voucher = voucher
        self.table = EngineTable(heartbeat_timeout=heartbeat_timeout)
        # Models unknown (none served) until an engine's /v1/models answers.
        self.table.set_static(
            [parse_static(s, Role.PREFILL) for s in prefill_engines] + [parse_static(s, Role.DECODE) for s in decode_engines],
            models=(),
        )
        # A factory: a fresh client (channel) after a failed refresh, so a registry that
        # comes back is seen at the next refresh, not after gRPC's reconnect back-off.
        self.refresher = RegistryRefresher(self.table, registry(), reconnect=registry) if registry is not None else None
        self.refresh_seconds = refresh_seconds
        self.refreshed = False
        # (role, URL) → its ref: the same object across refreshes, so a turn that started
        # before a refresh counts itself off the ref the next choice reads.
        self._refs: dict[tuple[str, str], EngineRef] = {}
        self.engines: list[EngineRef] = []  # every role's
        # model → its card, for the models with a prefill engine
        self.cards: dict[str, dict[str, Any]] = {}
        self._sync({})
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None

    @property
    def source(self) -> str:
        """`static`, `registry`, or `none`."""
        return "static" if self.table.static else ("registry" if self.refresher else "none")

    def start(self) -> None:
        """Refresh now and every `refresh_seconds`."""
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.refresher is not None:
            await self.refresher.close()
        if self.voucher is not None:
            await self.voucher.stop()

    async def _loop(self) -> None:
        failing = False
        while True:
            try:
                await self.refresh()
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep the last good view and keep refreshing
                if not failing:  # once per outage, not once per attempt
                    log.warning("engine refresh failed, keeping the last view: %r", exc)
                failing = True
            await asyncio.sleep(self.refresh_seconds if self.refreshed else min(0.5, self.refresh_seconds))

    async def refresh(self) -> None:
        """Re-read engines and models from their source."""
        if self.table.static:
            await self._refresh_static()
        elif self.refresher is not None:
            self.refreshed = await self.refresher.refresh() or self.refreshed
            self._sync()

    async def _probe(self, entry: PoolEntry) -> list[dict[str, Any]] | None:
        """The model cards a static engine's /v1/models lists; None when it does not answer."""
        url = entry.info.http_base_url
        try:
            resp = await self.http.get(url + "/v1/models", timeout=2.0)
            resp.raise_for_status()
            return [c for c in resp.json().get("data", []) if isinstance(c, dict) and isinstance(c.get("id"), str)]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if entry.available:
                log.warning("engine %s: /v1/models failed: %r", url, exc)
            return None

    async def _refresh_static(self) -> None:
        entries = list(self.table.static.values())
        results = await asyncio.gather(*(self._probe(e) for e in entries))
        cards = dict(self.cards)
        for entry, found in zip(entries, results):
            if found is None:
                entry.set_health(False)
                continue
            entry.set_health(True, tuple(c["id"] for c in found))
            if entry.info.role is Role.PREFILL:
                for card in found:
                    cards[card["id"]] = {**card, "owned_by": card.get("owned_by") or "boomerang"}
        self._sync(cards)
        self.refreshed = self.refreshed or any(results)
        if self.voucher is not None:
            self.voucher.after_probe(self.engines)

    def _usable(self) -> list[PoolEntry]:
        """The static engines, else per (model, role) the registry's available ones, else its stale ones."""
        if self.table.static:
            return list(self.table.static.values())
        usable: list[PoolEntry] = []
        for model, role in sorted({(e.info.model, e.info.role) for e in self.table.registry.values()}):
            found = self.table.candidates(model, role)
            usable += [e for e in found if e.available] or [
                e for e in found if e.unavailable_reason == HEARTBEAT_STALE and e.info.http_base_url
            ]
        return usable

    def _sync(self, cards: dict[str, dict[str, Any]] | None = None) -> None:
        """Rebuild the engines and cards from the table, keeping each (role, URL)'s ref and its
        in-flight count.

        `cards`: the static engines' model cards; registry engines get one built per model.
        """
        refs: dict[tuple[str, str], EngineRef] = {}
        for entry in self._usable():
            key = (_NAME[entry.info.role], entry.info.http_base_url)
            ref = refs.get(key)
            if ref is None:
                ref = refs[key] = self._refs.get(key) or EngineRef(key[1], key[0])
                ref.models = ()
            ref.engine_id = entry.info.engine_id
            ref.models = tuple(dict.fromkeys((*ref.models, *(entry.models or ()))))
            ref.healthy = entry.unavailable_reason != HEALTH_CHECK_FAILED
        self._refs = refs
        if cards is None:
            models = {m for ref in refs.values() if ref.role == PREFILL for m in ref.models}
            cards = {m: {"id": m, "object": "model", "created": 0, "owned_by": "boomerang", "root": m} for m in models}
        self.engines, self.cards = list(refs.values()), cards

    def models(self) -> list[dict[str, Any]]:
        """The model cards of models with at least one prefill engine."""
        return [self.cards[k] for k in sorted(self.cards)]

    def servable(self) -> int:
        """How many models have both a prefill and a decode engine: what a turn needs."""
        decoded = {m for e in self.engines if e.role == DECODE for m in e.models}
        return len(decoded & self.cards.keys())

    def serves(self, model: str) -> bool:
        """Whether some prefill engine serves `model`."""
        return model in self.cards

    def mark_down(self, url: str, seconds: float = DOWN_SECONDS) -> None:
        """Skip `url` for a while: a connection to it was refused."""
        self.table.mark_down(url, seconds)

    def choose(self, role: str, model: str, avoid: set[str] | None = None, key: str = "") -> EngineRef | None:
        """The least busy healthy engine of `role` serving `model` (round-robin on ties).

        With `key` (sticky routing: a conversation id), the engine `key` hashes to instead
        (rendezvous hashing), so each conversation's turns go to the same engine and its own
        prefix cache; an engine joining or leaving moves only the conversations it wins or
        held. With `avoid` (engines already tried), only the others, or None when there are none.
        """
        candidates = [e for e in self.engines if e.role == role and model in e.models]
        if avoid:
            candidates = [e for e in candidates if e.url not in avoid]
        if not candidates:
            return None
        up = [e for e in candidates if e.healthy and not self.table.is_down(e.url)]
        healthy = up or candidates
        if key:
            return max(healthy, key=lambda e: xxhash.xxh3_64_intdigest(f"{key}\0{e.url}".encode()))
        least = min(e.in_flight for e in healthy)
        tied = [e for e in healthy if e.in_flight == least]
        return tied[next(self._rr) % len(tied)]

    def find(self, role: str, url: str) -> EngineRef:
        """The pool's entry for a URL the router chose (a detached one if unknown)."""
        url = url.rstrip("/")
        for e in self.engines:
            if e.role == role and e.url == url:
                return e
        return EngineRef(url, role)


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
                    try:
                        body = resp.json()
                    except ValueError:
                        body = None
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
