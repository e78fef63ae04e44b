"""The gateway's engine choice over the shared engine table: which serve which model, and a fallback.

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
- its choice: the least busy by its own in-flight count, or a conversation's hash.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
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

from boomerang_gateway.liveness import Voucher

log = logging.getLogger(__name__)

PREFILL, DECODE = "prefill", "decode"
_NAME = {Role.PREFILL: PREFILL, Role.DECODE: DECODE}


@dataclass
class EngineRef:
    """One engine as the gateway sends to it: one per role and URL, kept across refreshes."""

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
        self.view = PoolView()
        self._sync({})
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None

    @property
    def source(self) -> str:
        """`static`, `registry`, or `none`."""
        return "static" if self.table.static else ("registry" if self.refresher else "none")

    @property
    def down_until(self) -> dict[str, float]:
        """URL → monotonic time until which it is skipped."""
        return self.table.down_until

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
        cards = dict(self.view.cards)
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
            self.voucher.after_probe(self.view.engines)

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
        """Rebuild the view from the table, keeping each (role, URL)'s ref and its in-flight count.

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
        self.view = PoolView(engines=list(refs.values()), cards=cards)

    def models(self) -> list[dict[str, Any]]:
        """The model cards of models with at least one prefill engine."""
        return [self.view.cards[k] for k in sorted(self.view.cards)]

    def servable(self) -> int:
        """How many models have both a prefill and a decode engine: what a turn needs."""
        decoded = {m for e in self.view.engines if e.role == DECODE for m in e.models}
        return len(decoded & self.view.cards.keys())

    def serves(self, model: str) -> bool:
        """Whether some prefill engine serves `model`."""
        return model in self.view.cards

    def mark_down(self, url: str, seconds: float = DOWN_SECONDS) -> None:
        """Skip `url` for a while: a connection to it was refused."""
        self.table.mark_down(url, seconds)

    def is_down(self, url: str) -> bool:
        """Whether `url` is being skipped."""
        return self.table.is_down(url)

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
