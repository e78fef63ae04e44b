"""The gateway's own view of the engines: which serve which model, and a fallback choice.

The router picks the engines for a planned turn. The gateway still needs its own pool to
tokenize before the plan, to know which models exist (404 for the rest, `GET /v1/models`),
and to keep serving when the router is down. Engines come from static flags (`--prefill`,
`--decode`; their models read from each engine's `/v1/models`) or from the block registry
(`ListEngines`: active engines with an HTTP base URL). A refresh that fails keeps the last
good view. Static engines that answer the probe healthy are vouched for in the registry
(a heartbeat on their behalf, see `liveness`), so idle engines without the hook keep their
leases.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_gateway.http import httpx
from boomerang_gateway.liveness import Voucher

log = logging.getLogger(__name__)

PREFILL, DECODE = "prefill", "decode"
DOWN_SECONDS = 5.0


@dataclass
class EngineRef:
    """One engine as the gateway knows it."""

    url: str
    role: str
    engine_id: str = ""
    models: tuple[str, ...] = ()
    healthy: bool = True
    in_flight: int = 0


@dataclass
class PoolView:
    """A snapshot: engines by role, and the model cards served."""

    engines: list[EngineRef] = field(default_factory=list)
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)


class EnginePool:
    """Engines and models, refreshed in the background."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        prefill_urls: list[str],
        decode_urls: list[str],
        registry: Callable[[], RegistryClient] | None,
        refresh_seconds: float,
        heartbeat_timeout: float = 30.0,
        voucher: Voucher | None = None,
    ):
        self.http = http
        self.voucher = voucher
        # A factory: a fresh client (channel) after a failed refresh, so a registry that
        # comes back is seen at the next refresh, not after gRPC's reconnect back-off.
        self.new_registry = registry
        self.registry = registry() if registry is not None else None
        self.refresh_seconds = refresh_seconds
        self.static = [EngineRef(u, PREFILL, u) for u in prefill_urls] + [EngineRef(u, DECODE, u) for u in decode_urls]
        self.view = PoolView(engines=list(self.static))
        self.refreshed = False
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None
        # URL → monotonic time until which it is skipped: set when a connection to it fails,
        # so a dead engine costs one refused connection, not one per turn (the registry
        # keeps listing it until its heartbeats time out).
        self.down_until: dict[str, float] = {}
        # engine id → (last heartbeat time seen, monotonic time it was first seen): an engine
        # whose heartbeat stops advancing leaves the pool before the reaper marks it dead.
        self.heartbeat_timeout = heartbeat_timeout
        self._beats: dict[str, tuple[float, float]] = {}

    @property
    def source(self) -> str:
        """`static`, `registry`, or `none`."""
        return "static" if self.static else ("registry" if self.registry else "none")

    def start(self) -> None:
        """Refresh now and every `refresh_seconds`."""
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.registry is not None:
            await self.registry.close()
        if self.voucher is not None:
            await self.voucher.stop()

    async def _loop(self) -> None:
        failing = False
        while True:
            try:
                await self.refresh()
                if failing:
                    log.info("engine refresh works again")
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep the last good view
                if not failing:  # once per outage, not once per attempt
                    log.warning("engine refresh failed, keeping the last view: %s", exc)
                failing = True
                if self.new_registry is not None and self.registry is not None:
                    await self.registry.close()
                    self.registry = self.new_registry()
            await asyncio.sleep(self.refresh_seconds if self.refreshed else min(0.5, self.refresh_seconds))

    async def refresh(self) -> None:
        """Re-read engines and models from their source."""
        if self.static:
            await self._refresh_static()
        elif self.registry is not None:
            await self._refresh_registry()

    async def _refresh_static(self) -> None:
        async def probe(engine: EngineRef) -> list[dict[str, Any]]:
            try:
                resp = await self.http.get(engine.url + "/v1/models", timeout=2.0)
                resp.raise_for_status()
                cards = [c for c in resp.json().get("data", []) if isinstance(c, dict) and isinstance(c.get("id"), str)]
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                if engine.healthy:
                    log.warning("engine %s: /v1/models failed: %r", engine.url, exc)
                engine.healthy = False
                return []
            engine.healthy = True
            engine.models = tuple(c["id"] for c in cards)
            return cards

        results = await asyncio.gather(*(probe(e) for e in self.static))
        cards = dict(self.view.cards)
        for engine, found in zip(self.static, results):
            if engine.role == PREFILL:
                for card in found:
                    cards[card["id"]] = {**card, "owned_by": card.get("owned_by") or "boomerang"}
        self.view = PoolView(engines=list(self.static), cards=cards)
        self.refreshed = self.refreshed or any(results)
        if self.voucher is not None:
            self.voucher.after_probe(self.static)

    async def _refresh_registry(self) -> None:
        assert self.registry is not None
        listed = await self.registry.list_engines(rpb.ListEnginesRequest(), timeout=2.0)
        old = {(e.role, e.url): e for e in self.view.engines}
        engines: list[EngineRef] = []
        stale: list[EngineRef] = []
        cards: dict[str, dict[str, Any]] = {}
        beats: dict[str, tuple[float, float]] = {}
        now_mono, now_wall = time.monotonic(), time.time()
        for e in listed.engines:
            if e.status != tpb.ENGINE_STATUS_ACTIVE or not e.http_base_url:
                continue
            # Judged on this process's monotonic clock once seen (the router does the same);
            # a first sighting estimates the heartbeat's age from wall clocks.
            beat = e.heartbeat_time.seconds + e.heartbeat_time.nanos / 1e9
            last = self._beats.get(e.engine_id)
            if last is None or last[0] != beat:
                last = (beat, now_mono - (max(0.0, now_wall - beat) if last is None and beat else 0.0))
            beats[e.engine_id] = last
            role = PREFILL if e.role == tpb.ENGINE_ROLE_PREFILL else DECODE
            url = e.http_base_url.rstrip("/")
            ref = EngineRef(url, role, e.engine_id, (e.model,))
            if (role, url) in old:
                ref.in_flight = old[(role, url)].in_flight
            if self.heartbeat_timeout > 0 and now_mono - last[1] > self.heartbeat_timeout:
                stale.append(ref)
                continue
            engines.append(ref)
        # Heartbeats also stop when the registry or its database was down, not only when an
        # engine died: where a model has no engine with a fresh heartbeat, its stale ones stay
        # (a dead one is refused and skipped per request) rather than failing every request.
        fresh_kinds = {(ref.role, ref.models) for ref in engines}
        engines += [ref for ref in stale if (ref.role, ref.models) not in fresh_kinds]
        for ref in engines:
            if ref.role == PREFILL:
                model = ref.models[0]
                cards[model] = {"id": model, "object": "model", "created": 0, "owned_by": "boomerang", "root": model}
        self.view = PoolView(engines=engines, cards=cards)
        self._beats = beats
        self.refreshed = True

    def models(self) -> list[dict[str, Any]]:
        """The model cards of models with at least one prefill engine."""
        return [self.view.cards[k] for k in sorted(self.view.cards)]

    def serves(self, model: str) -> bool:
        """Whether some prefill engine serves `model`."""
        return model in self.view.cards

    def mark_down(self, url: str, seconds: float = DOWN_SECONDS) -> None:
        """Skip `url` for a while: a connection to it was refused."""
        self.down_until[url] = time.monotonic() + seconds

    def is_down(self, url: str) -> bool:
        """Whether `url` is being skipped."""
        return self.down_until.get(url, 0.0) > time.monotonic()

    def choose(self, role: str, model: str, avoid: set[str] | None = None, key: str = "") -> EngineRef | None:
        """The least busy healthy engine of `role` serving `model` (round-robin on ties).

        With `key` (sticky routing: a conversation id), the engine `key` hashes to instead
        (rendezvous hashing), so each conversation's turns go to the same engine and its own
        prefix cache; an engine joining or leaving moves only the conversations it wins or
        held. With `avoid` (engines already tried), only the others, or None when there are none.
        """
        candidates = [e for e in self.view.engines if e.role == role and model in e.models]
        if avoid:
            candidates = [e for e in candidates if e.url not in avoid]
        if not candidates:
            return None
        healthy = [e for e in candidates if e.healthy and not self.is_down(e.url)] or candidates
        if key:
            return max(healthy, key=lambda e: xxhash.xxh3_64_intdigest(f"{key}\0{e.url}".encode()))
        least = min(e.in_flight for e in healthy)
        tied = [e for e in healthy if e.in_flight == least]
        return tied[next(self._rr) % len(tied)]

    def find(self, role: str, url: str) -> EngineRef:
        """The pool's entry for a URL the router chose (a detached one if unknown)."""
        url = url.rstrip("/")
        for e in self.view.engines:
            if e.role == role and e.url == url:
                return e
        return EngineRef(url, role)
