"""Heartbeats on behalf of the static engines the gateway serves, when they answer its health checks.

An engine without the vLLM hook never heartbeats. The router registers a decode engine like
that from its returned handle and heartbeats for it after each finished turn, but an idle
engine would still pass the reaper's heartbeat timeout and lose its leases. The gateway
probes every static engine's `/v1/models` anyway (the pool refresh); a probe that succeeds
becomes a `Heartbeat` for the registry engine at that URL, so idle engines keep their
leases until the TTL. A stopped engine fails its probe, nothing is sent, and the reaper
judges it dead as before.

What is vouched for, and what is not:
- only ACTIVE registry engines whose HTTP base URL and role are the probed engine's and whose
  model it serves; per URL only the latest registration (a restarted engine registers anew:
  the old one's blocks are gone, and it must not be kept alive by its successor's answers),
  and never a registration older than the last failed probe of that URL (a restarted engine
  is down for a while first, and until it registers anew the old registration must die);
- only when the engine's own heartbeats are not recent (a third of the timeout), so an
  engine that heartbeats itself keeps the load it reports;
- the gateway's `service:` principal may heartbeat for any engine (see `boomerang.auth`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.enginepool import Progress, progressed

log = logging.getLogger(__name__)

_ROLE: dict[str, int] = {"prefill": tpb.ENGINE_ROLE_PREFILL, "decode": tpb.ENGINE_ROLE_DECODE}


class Probed(Protocol):
    """What the voucher needs of a probed engine (the pool's EngineRef)."""

    url: str
    role: str
    models: tuple[str, ...]
    healthy: bool
    in_flight: int


def _seconds(ts: object) -> float:
    return getattr(ts, "seconds", 0) + getattr(ts, "nanos", 0) / 1e9


def vouchable(
    listed: Sequence[tpb.Engine], healthy: Sequence[Probed], down_at: dict[tuple[int, str], float] | None = None
) -> list[tuple[tpb.Engine, Probed]]:
    """The registry engines the healthy probed engines stand for.

    The latest registration per URL and role, if it is active, serves the probed model and
    registered after the URL's last failed probe (`down_at`, epoch seconds).
    """
    by_key = {(_ROLE[e.role], e.url.rstrip("/")): e for e in healthy if e.healthy and e.role in _ROLE}
    latest: dict[tuple[int, str], tpb.Engine] = {}
    for e in listed:
        key = (e.role, e.http_base_url.rstrip("/"))
        if key not in by_key:
            continue
        best = latest.get(key)
        if best is None or _seconds(e.register_time) > _seconds(best.register_time):
            latest[key] = e
    down_at = down_at or {}
    return [
        (e, by_key[key])
        for key, e in latest.items()
        if e.status == tpb.ENGINE_STATUS_ACTIVE
        and e.model in by_key[key].models
        and _seconds(e.register_time) > down_at.get(key, float("-inf"))
    ]


class Voucher:
    """Sends the heartbeats, in the background, at most one round at a time."""

    def __init__(self, registry: Callable[[], RegistryClient], heartbeat_timeout: float, timeout: float = 2.0):
        self.new_registry = registry
        self.registry: RegistryClient | None = None
        self.heartbeat_timeout = heartbeat_timeout
        self.timeout = timeout
        # engine id → its last heartbeat listed, and since when (monotonic) it was seen
        self._progress: dict[str, Progress] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        # (role, url) → epoch seconds of its last failed probe
        self._down_at: dict[tuple[int, str], float] = {}

    def after_probe(self, engines: Sequence[Probed]) -> None:
        """Start a round for the engines that just answered healthy (skipped while one runs)."""
        if self.heartbeat_timeout <= 0:
            return
        for e in engines:
            if not e.healthy and e.role in _ROLE:
                self._down_at[(_ROLE[e.role], e.url.rstrip("/"))] = time.time()
        if self._task is not None and not self._task.done():
            return
        healthy = [e for e in engines if e.healthy]
        if healthy:
            self._task = asyncio.ensure_future(self._round(healthy))

    async def _round(self, healthy: list[Probed]) -> None:
        try:
            if self.registry is None:
                self.registry = self.new_registry()
            listed = await self.registry.list_engines(rpb.ListEnginesRequest(), timeout=self.timeout)
            now, wall = time.monotonic(), time.time()
            for engine, probed in vouchable(listed.engines, healthy, self._down_at):
                beat = _seconds(engine.heartbeat_time)
                # Judged as the engine pool judges heartbeats (`boomerang_server.enginepool`).
                seen = self._progress[engine.engine_id] = progressed(self._progress.get(engine.engine_id), beat, now, wall)
                if now - seen.since < self.heartbeat_timeout / 3:
                    continue  # its own (or our last) heartbeat is recent
                await self._heartbeat(engine, probed)
                self._progress[engine.engine_id] = Progress(beat, now)
            if self._failing:
                log.info("heartbeats for static engines work again")
            self._failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - best effort: a stale engine only costs reuse
            if not self._failing:
                target = self.registry.target if self.registry is not None else "?"
                log.warning("cannot heartbeat for static engines in the registry at %s (retrying quietly): %s",
                            target, exc)
            self._failing = True
            if self.registry is not None:
                await self.registry.close()
                self.registry = None

    async def _heartbeat(self, engine: tpb.Engine, probed: Probed) -> None:
        assert self.registry is not None
        try:
            await self.registry.heartbeat(
                rpb.HeartbeatRequest(
                    engine_id=engine.engine_id,
                    registration_generation=engine.registration_generation,
                    in_flight_requests=probed.in_flight,
                ),
                timeout=self.timeout,
            )
        except BoomerangClientError as err:
            if err.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                raise
            # Re-registered or refused since the listing (or this gateway may not): only reuse is lost.
            log.debug("heartbeat for %s refused: %s", engine.engine_id, err)

    async def stop(self) -> None:
        """Cancel a round in progress and close the registry channel."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.registry is not None:
            await self.registry.close()
            self.registry = None
