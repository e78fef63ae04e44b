"""`boomerang registry`: run the block-registry service."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from boomerang.v1 import registry_service_pb2_grpc as rgrpc
from boomerang_server.credentials import CredentialStore
from boomerang_server.rpc.server import (
    Hosted,
    ServiceSpec,
    host,
    open_database,
    refresh_forever,
)
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.claim_store import TenantPool
from boomerang_registry.group_commit import RegistrationBatcher
from boomerang_registry.metrics import refresh_gauges
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.servicer import BlockRegistryServicer
from boomerang_registry.settings import RegistrySettings
from boomerang_registry.statements import WARM_UP, EpochFence

log = logging.getLogger(__name__)
SERVICE_NAME = "boomerang.v1.BlockRegistryService"


def no_jit(engine: AsyncEngine) -> None:
    """Turn PostgreSQL's JIT off on the engine's connections.

    The per-engine retained-block sums of ListEngines are estimated expensive enough to be
    JIT-compiled on every call: at 20,000 live leases compiling took 70 of its 97 ms
    (`boomerang bench`, EXPLAIN ANALYZE). Nothing the registry runs is a long analytic query.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SET jit = off")
        cursor.close()


async def run(settings: RegistrySettings) -> None:
    """Migrate, warm the pool, serve until SIGTERM, drain."""
    await (await start(settings)).serve()


async def start(settings: RegistrySettings) -> Hosted:
    """Migrate, warm the pool, start the background work; the servicer ready to serve."""
    engine = await open_database(settings, "registry", warm=4, prepare=no_jit)
    async with engine.begin() as conn:
        await conn.execute(text("SELECT boomerang_ensure_event_partitions(1, 7)"))
    # A registry started on a database that failed over fences before it serves (and before
    # the pool's warm-up claims, which the epoch check would refuse); later changes are found
    # by the statements themselves (statements.EpochFence).
    await EpochFence(engine, "registry").run()
    # Every tenant-scoped statement runs on this pool, as the row-level-security role.
    raw = await TenantPool.open(settings.database_url, settings.db_pool_size,
                                settings.db_tenant_role, warm=WARM_UP)
    repo = RegistryRepository(engine, raw, settings.ttl_margin_seconds)
    batcher = RegistrationBatcher(
        repo.turns, settings.group_commit_max_batch, workers=max(1, settings.db_pool_size // 4)
    )
    batcher.start()
    gauges = asyncio.create_task(refresh_forever(lambda: refresh_gauges(engine, repo.retained.get), 5.0))

    async def stop() -> None:
        gauges.cancel()
        await batcher.stop()
        await raw.close()
        await engine.dispose()

    credentials = CredentialStore.for_listener(engine, "registry", settings.listen, settings)
    servicer = BlockRegistryServicer(repo, settings, batcher, credentials)
    service = ServiceSpec(SERVICE_NAME, rgrpc.add_BlockRegistryServiceServicer_to_server, servicer)
    return host("registry", settings, settings.listen, service, stop, servicer.close_watches,
                settings.max_message_bytes)
