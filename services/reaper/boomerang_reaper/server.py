"""`boomerang reaper`: run one TTL-reaper replica."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from boomerang.v1 import reaper_service_pb2_grpc as pbgrpc
from boomerang_server.config import TelemetrySettings, load_settings
from boomerang_server.credentials import CredentialStore
from boomerang_server.rpc.server import ServiceSpec, host, open_database, refresh_forever

from boomerang_reaper import metrics
from boomerang_reaper.leader import ClockOffset, LeaderElection, ReaperRepository
from boomerang_reaper.registry_client import ReaperRegistryClient
from boomerang_reaper.retainer import Retainer
from boomerang_reaper.servicer import TTLReaperServicer
from boomerang_reaper.settings import ReaperSettings
from boomerang_reaper.worker import Reaper

log = logging.getLogger(__name__)
SERVICE_NAME = "boomerang.v1.TTLReaperService"


def default_replica_id() -> str:
    """host-pid-random: unique per process, readable in the audit trail."""
    host = "".join(ch for ch in socket.gethostname() if ch.isalnum() or ch in "-.")[:64] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def refresh_gauges(registry: ReaperRegistryClient, election: LeaderElection) -> None:
    """Leadership from this replica (read at each scrape); backlog and live leases from the registry."""
    metrics.LEADER.set_function(lambda: 1.0 if election.leader else 0.0)
    figures = await registry.count_live_leases()
    metrics.BACKLOG.set(figures.overdue_leases)
    metrics.LIVE.set(figures.live_leases)


async def run(settings: ReaperSettings) -> None:
    """Migrate, elect, reap while leading, serve until SIGTERM; release leadership on exit."""
    engine = await open_database(settings, "reaper", warm=2)
    replica_id = settings.replica_id or default_replica_id()
    repo = ReaperRepository(engine)
    registry = ReaperRegistryClient(settings.registry_address, timeout=settings.registry_timeout_seconds)
    clock = ClockOffset()
    # The election publishes the worker's stats with each renewal (any replica reports them).
    election = LeaderElection(
        repo, settings.election, replica_id, settings.leader_lease_seconds, clock, lambda: reaper.stats.to_json()
    )
    retainer = None
    if settings.release_interval_seconds > 0:
        per_token = load_settings(TelemetrySettings).prefill_ms_per_token / 1000
        retainer = Retainer(settings, registry, per_token)
    reaper = Reaper(settings, registry, election, clock, replica_id, retainer)
    tasks = [
        asyncio.create_task(election.run(), name="leader-election"),
        asyncio.create_task(reaper.run(), name="reaper"),
    ]
    tasks.append(asyncio.create_task(refresh_forever(lambda: refresh_gauges(registry, election), 5.0), name="metrics"))
    log.info("reaper replica %s, election %r, registry %s", replica_id, settings.election, settings.registry_address)

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await election.release()
        await registry.close()
        await engine.dispose()

    credentials = CredentialStore.for_listener(engine, "reaper", settings.listen, settings)
    servicer = TTLReaperServicer(settings, repo, registry, election, reaper, credentials)
    service = ServiceSpec(SERVICE_NAME, pbgrpc.add_TTLReaperServiceServicer_to_server, servicer)
    await host("reaper", settings, settings.listen, service, stop).serve()
