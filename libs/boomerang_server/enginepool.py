"""One engine pool for the router and the gateway: the engine record, static specs, the
registry's snapshot, health, and who may serve (model, role); free of HTTP.

Engines come from static flags (`--prefill`, `--decode`: `URL` or `NAME=URL`) or from the
block registry's `ListEngines` snapshot. Static engines, when configured for a role, are
that role's only engines. A registry engine is unavailable when the registry marks it dead
(the registry is the only judge of death and generation), when its heartbeat has not
advanced for `heartbeat_timeout` seconds on this process's clock, or when it has no HTTP
base URL to send work to; a static engine, while its health check fails. A URL whose
connection was refused can be marked down for a few seconds, so a dead engine costs one
refused connection, not one per request.

Services never ask the registry about engines per request: a background task refreshes the
table (`RegistryRefresher`). When the registry cannot be reached the last good snapshot stays
(engines do not leave the pool just because the control plane is down).

The table keeps no load and makes no choice: each service adds its own on top. The router
ranks candidates by reported and planned load (`boomerang_router.engines`); the gateway probes
static engines' `/v1/models`, vouches for them in the registry and falls back to its own
in-flight count or a conversation's hash (`boomerang_gateway.engine_routing`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Annotated, Any

from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from pydantic import BeforeValidator
from pydantic_settings import NoDecode

log = logging.getLogger(__name__)

DOWN_SECONDS = 5.0

DEAD = "DEAD"
HEARTBEAT_STALE = "HEARTBEAT_STALE"
NO_HTTP_BASE_URL = "NO_HTTP_BASE_URL"
HEALTH_CHECK_FAILED = "HEALTH_CHECK_FAILED"


class Role(str, enum.Enum):
    """An engine's role."""

    PREFILL = "PREFILL"
    DECODE = "DECODE"


class Source(str, enum.Enum):
    """Where the service learned of an engine."""

    REGISTRY = "REGISTRY"
    STATIC = "STATIC"


@dataclass(frozen=True)
class EngineInfo:
    """An engine as last seen: the registry's record, or a static flag's."""

    engine_id: str
    role: Role
    model: str = ""  # static engines: "" (their models are not registered)
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
    """An engine with its availability, and the models it may serve.

    `models` None: any model (a static engine nobody asked); a registry engine's is its one
    registered model; a probed static engine's, what its `/v1/models` listed.
    """

    info: EngineInfo
    available: bool = True
    unavailable_reason: str = ""
    models: tuple[str, ...] | None = None

    def serves(self, model: str) -> bool:
        """Whether this engine may serve `model`."""
        return self.models is None or model in self.models

    def set_health(self, healthy: bool, models: tuple[str, ...] | None = None) -> None:
        """Record a static engine's health-check verdict (and, given, the models it listed)."""
        self.available = healthy
        self.unavailable_reason = "" if healthy else HEALTH_CHECK_FAILED
        if models is not None:
            self.models = models


def parse_static(spec: str, role: Role) -> EngineInfo:
    """`URL` or `NAME=URL` from `--prefill`/`--decode`; the id is NAME, else the URL."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = spec, spec
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{spec.strip()!r}: an engine is URL or NAME=URL, the URL starting with http:// or https://")
    return EngineInfo(engine_id=name.strip().rstrip("/"), role=role, http_base_url=url, source=Source.STATIC)


def static_specs(value: Any) -> list[str]:
    """Static engine specs from a list (the flags) or a comma-separated string (the variable).

    Each is checked as `parse_static` reads it and written back whole (`NAME=URL` or `URL`,
    without a trailing slash), so a bad one fails at start-up, naming its setting.
    """
    items = value.split(",") if isinstance(value, str) else list(value or [])
    specs: list[str] = []
    for item in (str(i).strip() for i in items):
        if item:
            info = parse_static(item, Role.PREFILL)
            named = info.engine_id != item.rstrip("/")
            specs.append(f"{info.engine_id}={info.http_base_url}" if named else info.http_base_url)
    return specs


# A setting of static engines (`--prefill`, `--decode`), read by `static_specs`.
StaticEngines = Annotated[list[str], NoDecode, BeforeValidator(static_specs)]


@dataclass(frozen=True)
class Progress:
    """An engine's last heartbeat seen and when, on this process's monotonic clock, it was seen."""

    beat: float | None
    since: float


def progressed(seen: Progress | None, beat: float | None, mono: float, wall: float) -> Progress:
    """The progress after listing a heartbeat at `beat` (epoch seconds; None: never).

    A heartbeat is judged by whether it advanced between listings on this process's clock,
    so clock skew against the registry's database only matters the first time an engine is
    seen: its age is then estimated from the wall clocks.
    """
    if seen is not None and seen.beat == beat:
        return seen
    age = max(0.0, wall - beat) if seen is None and beat is not None else 0.0
    return Progress(beat, mono - age)


@dataclass
class EngineTable:
    """Static and registry engines, their availability, and the candidates for (model, role)."""

    heartbeat_timeout: float = 30.0
    mono: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    registry: dict[str, PoolEntry] = field(default_factory=dict)
    static: dict[tuple[Role, str], PoolEntry] = field(default_factory=dict)
    # URL → monotonic time until which it is skipped (a connection to it was refused).
    down_until: dict[str, float] = field(default_factory=dict)
    _progress: dict[str, Progress] = field(default_factory=dict)
    refreshed: bool = False

    # -- static engines ------------------------------------------------------------------

    def set_static(self, engines: Iterable[EngineInfo], models: tuple[str, ...] | None = None) -> None:
        """Replace the static engines (all healthy until a check fails), serving `models` (None: any)."""
        self.static = {(e.role, e.engine_id): PoolEntry(e, models=models) for e in engines}

    def set_static_health(self, engine_id: str, healthy: bool, models: tuple[str, ...] | None = None) -> None:
        """Record a static engine's health-check verdict (and, given, the models it listed)."""
        for (_, eid), entry in self.static.items():
            if eid == engine_id:
                entry.set_health(healthy, models)

    # -- registry engines ----------------------------------------------------------------

    def apply_registry_snapshot(self, engines: Iterable[EngineInfo]) -> None:
        """Replace the registry's engines with a fresh ListEngines answer."""
        now_mono, now_wall = self.mono(), self.wall()
        fresh: dict[str, PoolEntry] = {}
        progress: dict[str, Progress] = {}
        for info in engines:
            beat = info.heartbeat_at.timestamp() if info.heartbeat_at is not None else None
            seen = progress[info.engine_id] = progressed(self._progress.get(info.engine_id), beat, now_mono, now_wall)
            entry = PoolEntry(info, models=(info.model,))
            if not info.active:
                entry.available, entry.unavailable_reason = False, DEAD
            elif self.heartbeat_timeout > 0 and now_mono - seen.since > self.heartbeat_timeout:
                entry.available, entry.unavailable_reason = False, HEARTBEAT_STALE
            elif not info.http_base_url:
                entry.available, entry.unavailable_reason = False, NO_HTTP_BASE_URL
            fresh[info.engine_id] = entry
        self.registry, self._progress, self.refreshed = fresh, progress, True

    def heartbeat_age(self, engine_id: str) -> float | None:
        """Seconds since this process saw the engine's heartbeat advance; None if never seen."""
        seen = self._progress.get(engine_id)
        return None if seen is None else max(0.0, self.mono() - seen.since)

    def known(self, engine_id: str) -> EngineInfo | None:
        """The registry's record of an engine, if this process has seen it."""
        entry = self.registry.get(engine_id)
        return None if entry is None else entry.info

    def source_alive(self, engine_id: str, generation: int) -> bool:
        """Whether a lease's engine may still be read from, as far as this process can tell.

        An engine not seen is trusted: the registry's claim already checked its status and
        generation in the same statement.
        """
        entry = self.registry.get(engine_id)
        if entry is None:
            return True
        if not entry.info.active or entry.unavailable_reason == HEARTBEAT_STALE:
            return False
        return entry.info.generation <= generation

    # -- connections refused -------------------------------------------------------------

    def mark_down(self, url: str, seconds: float = DOWN_SECONDS) -> None:
        """Skip `url` for a while: a connection to it was refused."""
        self.down_until[url] = self.mono() + seconds

    def is_down(self, url: str) -> bool:
        """Whether `url` is being skipped."""
        return self.down_until.get(url, 0.0) > self.mono()

    # -- who may serve -------------------------------------------------------------------

    def candidates(self, model: str, role: Role) -> Sequence[PoolEntry]:
        """Every engine of `role` that may serve `model`, available or not (static ones win if any)."""
        static = [e for e in self.static.values() if e.info.role is role]
        pool = static or [e for e in self.registry.values() if e.info.role is role]
        return [e for e in pool if e.serves(model)]

    def entries(self, model: str = "", role: Role | None = None) -> Sequence[PoolEntry]:
        """Static and registry engines (of `model`, `role`, when given), by role then id, as copies."""
        out: list[PoolEntry] = []
        for r in (Role.PREFILL, Role.DECODE):
            if role is not None and r is not role:
                continue
            static = [e for e in self.static.values() if e.info.role is r]
            registry = [e for e in self.registry.values() if e.info.role is r and (not model or e.info.model == model)]
            out += [replace(e) for e in sorted([*static, *registry], key=lambda e: e.info.engine_id)]
        return out


# -- kept current from the registry ------------------------------------------------------

_ROLE = {tpb.ENGINE_ROLE_PREFILL: Role.PREFILL, tpb.ENGINE_ROLE_DECODE: Role.DECODE}


def engine_info(e: tpb.Engine) -> EngineInfo | None:
    """A table record for a registry Engine message (None for an unknown role)."""
    role = _ROLE.get(e.role)
    if role is None:
        return None
    return EngineInfo(
        engine_id=e.engine_id,
        role=role,
        model=e.model,
        http_base_url=e.http_base_url.rstrip("/"),
        generation=e.registration_generation,
        active=e.status == tpb.ENGINE_STATUS_ACTIVE,
        heartbeat_at=e.heartbeat_time.ToDatetime(tzinfo=UTC) if e.HasField("heartbeat_time") else None,
        in_flight=e.in_flight_requests,
        queued_prompt_tokens=e.queued_prompt_tokens,
        retained_blocks=e.retained_blocks,
        bytes_per_block=e.bytes_per_block,
        block_size=e.block_size,
        kv_recompute_threshold=e.kv_recompute_threshold,
        kv_blocks_ttl_seconds=e.kv_blocks_ttl_seconds,
        side_channel_host=e.side_channel_host,
        side_channel_port=e.side_channel_port,
        tp_size=e.tp_size or 1,
        dcp_size=e.dcp_size or 1,
        pp_size=e.pp_size or 1,
        source=Source.REGISTRY,
    )


class RegistryRefresher:
    """Refreshes a table's registry engines from ListEngines.

    With `reconnect` (a client factory), a failed refresh closes the client and makes a
    fresh one, so a registry that comes back is seen at the next refresh, not after gRPC's
    reconnect back-off; without it the client is the caller's (shared) and left open.
    """

    def __init__(
        self,
        table: EngineTable,
        registry: RegistryClient,
        timeout: float = 2.0,
        reconnect: Callable[[], RegistryClient] | None = None,
    ):
        self.table = table
        self.registry = registry
        self.timeout = timeout
        self.reconnect = reconnect
        self.failures = 0

    async def refresh(self) -> bool:
        """One refresh; False (and the last snapshot kept) when the registry did not answer."""
        try:
            resp = await self.registry.list_engines(rpb.ListEnginesRequest(), timeout=self.timeout)
            self.table.apply_registry_snapshot(i for i in map(engine_info, resp.engines) if i is not None)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last snapshot
            self.failures += 1
            if self.failures == 1 or self.failures % 60 == 0:
                log.warning("engine refresh failed (%d in a row), keeping the last view: %s", self.failures, exc)
            if self.reconnect is not None:
                await self.registry.close()
                self.registry = self.reconnect()
            return False
        if self.failures:
            log.info("engine refresh works again")
        self.failures = 0
        return True

    async def tick(self) -> None:
        """Periodic entry point."""
        await self.refresh()

    async def close(self) -> None:
        """Close the client if it is this refresher's own (made by `reconnect`'s factory)."""
        if self.reconnect is not None:
            await self.registry.close()
