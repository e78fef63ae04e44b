"""`boomerang router`: wire the router together and serve it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections import Counter
from pathlib import Path

import grpc
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang_server.config import normalize_database_url
from boomerang_server.credentials import CredentialStore
from boomerang_server.enginepool import RegistryRefresher, Role, parse_static
from boomerang_server.rpc.server import Hosted, ServiceSpec, host, open_database
from sqlalchemy.engine import make_url

from boomerang_router.claims import ReuseClaimer
from boomerang_router.engines import EnginePool, HealthProber, every
from boomerang_router.learning import CostModels, Priors
from boomerang_router.plan_store import PlanStore
from boomerang_router.planner import Router
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.rpc_surface import RouterServicer
from boomerang_router.settings import RouterSettings
from boomerang_router.settlement import ClaimKeeper, Reporter
from boomerang_router.spool import AuditSpool
from boomerang_router.ttft import CopyCost, PrefillCost

log = logging.getLogger(__name__)
SERVICE_NAME = "boomerang.v1.RouterService"


def build_pool(settings: RouterSettings) -> EnginePool:
    """The engine pool with the static engines from the settings."""
    pool = EnginePool(
        heartbeat_timeout=settings.heartbeat_timeout_seconds,
        inflight_token_weight=settings.inflight_token_weight,
        default_block_size=settings.block_size,
        default_threshold=settings.kv_recompute_threshold,
    )
    pool.set_static(
        [parse_static(s, Role.PREFILL) for s in settings.prefill_engines]
        + [parse_static(s, Role.DECODE) for s in settings.decode_engines]
    )
    return pool


def build_router(
    settings: RouterSettings,
    registry: RegistryClient,
    pool: EnginePool,
    audit: AuditWriter,
    repo: TurnPlanRepository,
    name: str = "",
) -> Router:
    """The router's steps put together: one registry client and one set of stats for all."""
    stats: Counter[str] = Counter()
    plan_bytes = int(settings.plan_memory_mb * 2**20)
    store = PlanStore(settings.plan_memory_seconds, settings.plan_memory_max, max_bytes=plan_bytes)
    keeper = ClaimKeeper(settings, registry, store, repo, stats)
    claimer = ReuseClaimer(settings, registry, keeper, stats)
    reporter = Reporter(settings, registry, pool)
    models = cost_models(settings)
    return Router(settings, pool, audit, repo, store, models, claimer, reporter, stats, name)


def cost_models(settings: RouterSettings) -> CostModels:
    """The learned costs, starting from the configured defaults (rebuilt on every start)."""
    return CostModels(Priors(
        PrefillCost(settings.ttft_prefill_floor_ms, settings.ttft_prefill_token_ms,
                    settings.ttft_prefill_attention_ms, settings.ttft_prefill_context_ms),
        CopyCost(settings.ttft_copy_fixed_ms, settings.ttft_copy_token_ms),
        settings.ttft_inter_token_ms,
        settings.ttft_learning_turns,
        settings.decode_prefill_itl_bound,
    ))


async def _warm_registry(registry: RegistryClient, refresher: RegistryRefresher, timeout: float = 5.0) -> None:
    """Connect to the registry and load the engine pool before taking calls (best effort)."""
    try:
        if registry.channel is not None:  # None: the registry is in this process
            await asyncio.wait_for(registry.channel.channel_ready(), timeout)
    except (TimeoutError, grpc.aio.AioRpcError):
        log.warning("registry %s not reachable at start; plans are degraded until it is", registry.target)
        return
    if not await refresher.refresh():
        log.warning("could not load engines from the registry at start; retrying in the background")


def _audit_spool(settings: RouterSettings) -> AuditSpool | None:
    """The on-disk audit spool, or None (not configured, or its directory unusable: said loudly)."""
    if not settings.audit_spool_dir:
        log.warning("no audit spool (BOOMERANG_AUDIT_SPOOL_DIR is empty): turn_plans rows are dropped "
                    "while Postgres is down")
        return None
    # One folder per database: a spooled row is replayed only into the database it was for.
    url = make_url(normalize_database_url(settings.require_database()))
    hosts = url.query.get("host") or f"{url.host}:{url.port}"  # several: an HA Postgres's nodes
    where = hashlib.sha256(f"{hosts}/{url.database}".encode()).hexdigest()[:16]
    try:
        return AuditSpool(Path(settings.audit_spool_dir) / where, settings.audit_spool_max_bytes, socket.gethostname())
    except OSError as exc:
        log.error("cannot use the audit spool directory %s (%s): turn_plans rows are dropped while Postgres is "
                  "down", settings.audit_spool_dir, exc)
        return None


async def run(settings: RouterSettings) -> None:
    """Migrate, warm the pools, serve until SIGTERM, drain."""
    await (await start(settings)).serve()


async def start(settings: RouterSettings, registry: RegistryClient | None = None) -> Hosted:
    """Migrate, warm the pools, start the background work; the servicer ready to serve.

    `registry`: the registry in this process (`boomerang control-plane`); else a client of
    `registry_address`."""
    engine = await open_database(settings, "router", warm=2)
    repo = TurnPlanRepository(engine)
    await repo.ensure_partitions()
    audit = AuditWriter(
        repo,
        flush_interval=settings.audit_flush_ms / 1000,
        batch_size=settings.audit_batch_size,
        max_pending=settings.audit_queue_max,
        spool=_audit_spool(settings),
    )
    audit.start()
    if registry is None:
        registry = RegistryClient(settings.registry_address, timeout=settings.report_timeout_seconds)
    pool = build_pool(settings)
    refresher = RegistryRefresher(pool, registry)
    await _warm_registry(registry, refresher)
    prober = HealthProber(pool, failures=settings.health_check_failures)
    refresh = every("engine-refresh", settings.engine_refresh_seconds, refresher.tick)
    loops = [asyncio.create_task(refresh)]
    if pool.static and settings.health_check_seconds > 0:
        await prober.probe_all()
        health = every("engine-health", settings.health_check_seconds, prober.probe_all)
        loops.append(asyncio.create_task(health))
    router = build_router(settings, registry, pool, audit, repo)

    async def stop() -> None:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await router.drain()
        await audit.stop()
        await prober.close()
        await registry.close()
        await engine.dispose()

    credentials = CredentialStore.for_listener(engine, "router", settings.listen, settings)
    service = ServiceSpec(SERVICE_NAME, rtgrpc.add_RouterServiceServicer_to_server,
                          RouterServicer(router, credentials))
    return host("router", settings, settings.listen, service, stop,
                max_message_bytes=settings.max_message_bytes)
