"""Running the gateway: wiring, uvicorn, `BOOMERANG_READY`, and a drain that loses nothing.

On SIGTERM/SIGINT `/health` turns 503 at once (load balancers stop sending) while requests
are still served for `drain_delay_seconds`; then uvicorn stops accepting, in-flight turns
get `grace_seconds` to finish, and pending ReportTurn calls are awaited before exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import uvicorn
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.leasekeys import RETRY_SECONDS, LeaseSummary, apply
from boomerang.telemetry import asgi_app, setup_tracing, shutdown_tracing
from boomerang_server.db import make_engine, upgrade
from boomerang_server.sockets import listen_socket

from boomerang_gateway.app import Handlers, create_app
from boomerang_gateway.control import ControlPlane
from boomerang_gateway.engine_routing import EngineCalls, EngineRouting
from boomerang_gateway.liveness import Voucher
from boomerang_gateway.local_tokenize import InProcessTokenizers
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.settings import GatewaySettings
from boomerang_gateway.tenants import TenantAuth, TenantRateLimiter, TenantStore
from boomerang_gateway.turn import TurnRunner

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn with a drain delay: the first signal marks the gateway draining, exits later."""

    def __init__(self, config: uvicorn.Config, handlers: Handlers, drain_delay: float):
        super().__init__(config)
        self.handlers = handlers
        self.drain_delay = drain_delay
        self.exit_at: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.exit_at is not None:  # a second signal: stop now
            super().handle_exit(sig, frame)
            return
        self.handlers.draining = True
        self.exit_at = time.monotonic() + self.drain_delay

    async def on_tick(self, counter: int) -> bool:
        if self.exit_at is not None and time.monotonic() >= self.exit_at:
            return True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn's own capture re-raises the signal after shutdown; route it to handle_exit only.

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


@dataclass(frozen=True)
class Peers:
    """How the gateway reaches the router and the registry: over the network when it runs
    alone, or in this process (`boomerang control-plane --gateway-listen`)."""

    router: Callable[[], RouterClient]
    registry: Callable[[], RegistryClient]


async def watch_lease_keys(client: RegistryClient, summary: LeaseSummary, watcher: str) -> None:
    """Keep the gateway's copy of the registry's live-lease summary current from WatchLeaseKeys
    until cancelled, reconnecting after a pause; unknown (every prompt a "maybe") while the
    stream is down."""
    while True:
        try:
            async for message in client.watch_lease_keys(watcher):
                apply(summary, message)
        except asyncio.CancelledError:
            summary.lost()
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the summary is unknown until the next snapshot
            log.info("lease-keys watch ended (%s); retrying in %.1f s", exc, RETRY_SECONDS)
        summary.lost()
        await asyncio.sleep(RETRY_SECONDS)


async def run(settings: GatewaySettings) -> None:
    """Serve alone until SIGTERM/SIGINT, then drain."""
    setup_tracing("boomerang-gateway")
    try:
        await serve(settings, Peers(  # the router and the registry at their configured addresses
            lambda: RouterClient(settings.router_address, settings.report_turn_timeout_seconds,
                                 settings.plan_timeout_seconds),
            lambda: RegistryClient(settings.registry_address),
        ))
    finally:
        shutdown_tracing()


async def serve(settings: GatewaySettings, peers: Peers) -> None:
    """Serve until SIGTERM/SIGINT, then drain (this process's tracing is the caller's)."""
    # One line per engine call would drown the gateway's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    db = None
    if settings.database_url:
        if settings.migrate_on_start:
            await asyncio.to_thread(upgrade, settings.database_url)
        db = make_engine(settings.database_url, settings.db_pool_size, "boomerang-gateway")
    metrics = GatewayMetrics()
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(settings.engine_timeout_seconds, connect=settings.engine_connect_timeout_seconds),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
    )
    static = bool(settings.prefill_engines or settings.decode_engines)
    registry = peers.registry if not static and settings.registry_address else None
    # With the engines' hook planning, the gateway never calls the router.
    router = peers.router() if settings.router_address and not settings.engine_hook else None
    # Static engines answering their health checks are vouched for in the registry (heartbeats).
    voucher = Voucher(peers.registry, settings.heartbeat_timeout_seconds) if static and settings.registry_address else None
    pool = EngineRouting(http, settings.prefill_engines, settings.decode_engines, registry, settings.engine_refresh_seconds,
                         settings.heartbeat_timeout_seconds, voucher)
    control = ControlPlane(
        router,
        settings.plan_timeout_seconds,
        settings.report_turn_timeout_seconds,
        settings.control_plane_backoff_seconds,
        on_report=lambda outcome: metrics.reports.labels(outcome).inc(),
        reconnect=peers.router,
        commit_timeout=settings.report_commit_timeout_seconds,
        prefill_on_decode=settings.prefill_on_decode,
    )
    local = InProcessTokenizers(settings.tokenizers, settings.tokenizer_hf_cache, metrics) if settings.tokenizers else None
    if local is not None:
        await local.load_all()
    # The live-lease summary: turns of conversations with no live lease skip their plan's wait.
    summary, keys_client, watching = None, None, None
    if router is not None and settings.registry_address and settings.lease_summary:
        summary, keys_client = LeaseSummary(), peers.registry()
        watching = asyncio.ensure_future(watch_lease_keys(keys_client, summary, f"gateway:{settings.listen}"))
    engines = EngineCalls(http, pool, metrics, settings.sticky_prefill)
    runner = TurnRunner(engines, control, metrics, settings, local, summary)
    auth = TenantAuth(TenantStore(db) if db is not None else None, settings.allow_anonymous, settings.key_cache_seconds)
    limiter = TenantRateLimiter(settings.tenant_requests_per_second, settings.tenant_burst)
    handlers = Handlers(auth, pool, runner, metrics, settings.max_body_bytes, limiter)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(pool.refresh(), timeout=3.0)
    pool.start()
    sock = listen_socket(settings.listen, "gateway")
    server = _Server(
        uvicorn.Config(
            asgi_app(create_app(handlers)),  # HTTP server spans when tracing is on
            lifespan="off",
            log_level="warning",
            access_log=False,
            # uvicorn waits with asyncio.wait_for, which takes float seconds; its annotation says int.
            timeout_graceful_shutdown=max(0.1, settings.grace_seconds),  # type: ignore[arg-type]
            timeout_keep_alive=30,
            backlog=2048,
        ),
        handlers,
        min(settings.drain_delay_seconds, settings.grace_seconds),
    )
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    try:
        if not serving.done():
            host, port = sock.getsockname()[:2]
            print(f"BOOMERANG_READY gateway {host}:{port}", flush=True)
            log.info("gateway listening on %s:%d (engines: %s, router: %s)", host, port, pool.source,
                     settings.router_address or "none")
        await serving
    finally:
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        if keys_client is not None:
            await keys_client.close()
        await control.drain(settings.grace_seconds)
        await pool.stop()
        await http.aclose()
        if db is not None:
            await db.dispose()
        log.info("gateway stopped")
