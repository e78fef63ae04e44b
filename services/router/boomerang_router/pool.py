"""The engine pool and engine choice, free of gRPC: who may serve a turn, and who is least busy.

Engines come from the registry (refreshed in the background, never asked per plan) or from
static flags. An engine leaves the pool when the registry marks it dead, when its heartbeat
has not advanced for `heartbeat_timeout` seconds, when a static engine fails its health
checks, or when it has no HTTP base URL to route to.

Load combines what engines report in heartbeats with what this router planned and has not
yet seen reported (taking the larger of each, since a heartbeat may or may not include the
router's latest turns): a prefill engine's load is its queued prompt tokens plus a weight
per in-flight turn; a decode engine's is its in-flight turns, ties going to the engine with
the least retained KV memory.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime


class Role(str, enum.Enum):
    """An engine's role."""

    PREFILL = "PREFILL"
    DECODE = "DECODE"


class Source(str, enum.Enum):
    """Where the router learned of an engine."""

    REGISTRY = "REGISTRY"
    STATIC = "STATIC"


@dataclass(frozen=True)
class EngineInfo:
    """An engine as last seen."""

    engine_id: str
    role: Role
    model: str = ""  # static engines: "" serves every model
    http_base_url: str = ""
    generation: int = 0
    active: bool = True
    heartbeat_at: datetime | None = None
    in_flight: int = 0
    queued_prompt_tokens: int = 0
    retained_blocks: int = 0
    bytes_per_block: int = 0
    block_size: int = 0
    kv_recompute_threshold: int = 0
    kv_blocks_ttl_seconds: int = 0
    side_channel_host: str = ""
    side_channel_port: int = 0
    tp_size: int = 1
    dcp_size: int = 1
    pp_size: int = 1
    source: Source = Source.REGISTRY


@dataclass
class PoolEntry:
    """An engine with its availability and the router's own load accounting."""

    info: EngineInfo
    available: bool = True
    unavailable_reason: str = ""
    planned_turns: int = 0
    planned_prompt_tokens: int = 0
    load: float = 0.0


def parse_static(spec: str, role: Role) -> EngineInfo:
    """`URL` or `NAME=URL` from `--prefill`/`--decode`; the id is NAME, else the URL."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = spec, spec
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"engine URL must start with http:// or https://, got {spec!r}")
    return EngineInfo(engine_id=name.strip().rstrip("/"), role=role, http_base_url=url, source=Source.STATIC)


@dataclass
class _Progress:
    heartbeat_at: datetime | None
    seen_mono: float


@dataclass
class EnginePool:
    """The engines plans may choose from, and how busy each is."""

    heartbeat_timeout: float = 30.0
    inflight_token_weight: int = 256
    default_block_size: int = 16
    default_threshold: int = 64
    mono: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    registry: dict[str, PoolEntry] = field(default_factory=dict)
    static: dict[str, PoolEntry] = field(default_factory=dict)
    _progress: dict[str, _Progress] = field(default_factory=dict)
    _planned: dict[str, list[int]] = field(default_factory=dict)  # id → [turns, tokens]
    refreshed: bool = False

    # -- membership ----------------------------------------------------------------------

    def set_static(self, engines: Iterable[EngineInfo]) -> None:
        """Replace the static engines (all healthy until a check fails)."""
        self.static = {e.engine_id: PoolEntry(e) for e in engines}

    def set_static_health(self, engine_id: str, healthy: bool) -> None:
        """Record a static engine's health-check verdict."""
        entry = self.static.get(engine_id)
        if entry is not None:
            entry.available = healthy
            entry.unavailable_reason = "" if healthy else "HEALTH_CHECK_FAILED"

    def apply_registry_snapshot(self, engines: Iterable[EngineInfo]) -> None:
        """Replace the registry's engines with a fresh ListEngines answer.

        A heartbeat is judged by whether it advanced between refreshes on this router's
        monotonic clock, so clock skew between router and database only matters the first
        time an engine is seen (its age is then estimated from wall clocks).
        """
        now_mono, now_wall = self.mono(), self.wall()
        fresh: dict[str, PoolEntry] = {}
        progress: dict[str, _Progress] = {}
        for info in engines:
            seen = self._progress.get(info.engine_id)
            if seen is None or seen.heartbeat_at != info.heartbeat_at:
                if seen is None and info.heartbeat_at is not None:
                    age = max(0.0, now_wall - info.heartbeat_at.timestamp())
                else:
                    age = 0.0
                seen = _Progress(info.heartbeat_at, now_mono - age)
            progress[info.engine_id] = seen
            entry = PoolEntry(info)
            if not info.active:
                entry.available, entry.unavailable_reason = False, "DEAD"
            elif self.heartbeat_timeout > 0 and now_mono - seen.seen_mono > self.heartbeat_timeout:
                entry.available, entry.unavailable_reason = False, "HEARTBEAT_STALE"
            fresh[info.engine_id] = entry
        self.registry, self._progress, self.refreshed = fresh, progress, True

    def heartbeat_age(self, engine_id: str) -> float | None:
        """Seconds since this router saw the engine's heartbeat advance; None if never seen."""
        seen = self._progress.get(engine_id)
        return None if seen is None else max(0.0, self.mono() - seen.seen_mono)

    def known(self, engine_id: str) -> EngineInfo | None:
        """The registry's record of an engine, if this router has seen it."""
        entry = self.registry.get(engine_id)
        return None if entry is None else entry.info

    def source_alive(self, engine_id: str, generation: int) -> bool:
        """Whether a lease's engine may still be read from, as far as the router can tell.

        An engine the router has not seen is trusted: the registry's claim already checked
        its status and generation in the same statement.
        """
        entry = self.registry.get(engine_id)
        if entry is None:
            return True
        if not entry.info.active or entry.unavailable_reason == "HEARTBEAT_STALE":
            return False
        return entry.info.generation <= generation

    # -- choice --------------------------------------------------------------------------

    def candidates(self, model: str, role: Role) -> list[PoolEntry]:
        """Every engine of `role` for `model`, available or not (static ones win if any)."""
        static = [e for e in self.static.values() if e.info.role is role]
        if static:
            pool = static
        else:
            pool = [e for e in self.registry.values() if e.info.role is role and e.info.model == model]
        for entry in pool:
            self._score(entry)
        return pool

    def _score(self, entry: PoolEntry) -> None:
        turns, tokens = self._planned.get(entry.info.engine_id, (0, 0))
        entry.planned_turns, entry.planned_prompt_tokens = turns, tokens
        in_flight = max(entry.info.in_flight, turns)
        if entry.info.role is Role.PREFILL:
            queued = max(entry.info.queued_prompt_tokens, tokens)
            entry.load = float(queued + self.inflight_token_weight * in_flight)
        else:
            entry.load = float(in_flight)
        if entry.available and not entry.info.http_base_url:
            entry.available, entry.unavailable_reason = False, "NO_HTTP_BASE_URL"

    def choose(self, model: str, role: Role) -> EngineInfo | None:
        """The least-loaded available engine of `role` for `model`, or None."""
        best: tuple[float, int, str] | None = None
        chosen: EngineInfo | None = None
        for entry in self.candidates(model, role):
            if not entry.available:
                continue
            info = entry.info
            retained = info.retained_blocks * (info.bytes_per_block or 1) if role is Role.DECODE else 0
            key = (entry.load, retained, info.engine_id)
            if best is None or key < best:
                best, chosen = key, info
        return chosen

    def block_size(self, model: str) -> int:
        """Tokens per block of `model`'s decode engines (the most common), else the default."""
        sizes = Counter(
            e.info.block_size
            for e in self.registry.values()
            if e.info.role is Role.DECODE and e.info.model == model and e.info.block_size > 0
        )
        return sizes.most_common(1)[0][0] if sizes else self.default_block_size

    def threshold(self, prefill: EngineInfo) -> int:
        """The prefill engine's own `kv_recompute_threshold`, else the default."""
        return prefill.kv_recompute_threshold or self.default_threshold

    # -- load ----------------------------------------------------------------------------

    def add_planned(self, engine_id: str, turns: int, tokens: int) -> None:
        """Count (or, with negative numbers, uncount) turns planned on an engine."""
        slot = self._planned.setdefault(engine_id, [0, 0])
        slot[0] = max(0, slot[0] + turns)
        slot[1] = max(0, slot[1] + tokens)
        if slot == [0, 0]:
            del self._planned[engine_id]

    def entries(self, model: str = "", role: Role | None = None) -> list[PoolEntry]:
        """The pool for ListEngines: static and registry engines, by role then id."""
        out: list[PoolEntry] = []
        for r in (Role.PREFILL, Role.DECODE):
            if role is not None and r is not role:
                continue
            static = [e for e in self.static.values() if e.info.role is r]
            registry = [
                e for e in self.registry.values() if e.info.role is r and (not model or e.info.model == model)
            ]
            for entry in sorted([*static, *registry], key=lambda e: e.info.engine_id):
                view = replace(entry)
                self._score(view)
                out.append(view)
        return out
