"""Keeping the engine pool current in the background: registry refresh and health checks.

Plans never ask the registry about engines; a background task refreshes the pool from
`ListEngines` every `refresh_seconds` (`boomerang_server.enginepool.RegistryRefresher`,
shared with the gateway: a failed refresh keeps the last snapshot). Static engines
(`--prefill`, `--decode`) are probed with `GET <url>/health`; after `failures` consecutive
failed probes an engine leaves the pool until a probe succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import httpx
from boomerang_server.enginepool import RegistryRefresher

from boomerang_router.pool import EnginePool

__all__ = ["HealthProber", "Periodic", "RegistryRefresher"]

log = logging.getLogger(__name__)


class Periodic:
    """Runs an async function every `interval` seconds until stopped."""

    def __init__(self, name: str, interval: float, fn: Callable[[], Awaitable[None]]):
        self.name = name
        self.interval = interval
        self.fn = fn
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (a no-op for a non-positive interval)."""
        if self._task is None and self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Stop the loop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.debug("%s failed", self.name, exc_info=True)


class HealthProber:
    """Probes static engines' `/health` and records the verdict in the pool."""

    def __init__(self, pool: EnginePool, path: str = "/health", timeout: float = 1.0, failures: int = 2):
        self.pool = pool
        self.path = path
        self.timeout = timeout
        self.failures = failures
        self._misses: dict[str, int] = {}
        self._client: httpx.AsyncClient | None = None

    async def probe_all(self) -> None:
        """Probe every static engine once, concurrently."""
        if not self.pool.static:
            return
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
        entries = list(self.pool.static.values())
        results = await asyncio.gather(*(self._probe(e.info.http_base_url) for e in entries))
        for entry, ok in zip(entries, results):
            engine_id = entry.info.engine_id
            misses = 0 if ok else self._misses.get(engine_id, 0) + 1
            self._misses[engine_id] = misses
            if ok and not entry.available:
                log.info("static engine %s is healthy again", engine_id)
                self.pool.set_static_health(engine_id, True)
            elif misses >= self.failures and entry.available:
                log.warning("static engine %s failed %d health checks; leaving the pool", engine_id, misses)
                self.pool.set_static_health(engine_id, False)

    async def _probe(self, base_url: str) -> bool:
        assert self._client is not None
        try:
            resp = await self._client.get(base_url + self.path)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
