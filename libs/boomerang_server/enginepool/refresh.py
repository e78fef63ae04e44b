"""Keeping an engine table current from the block registry's `ListEngines`.

Services never ask the registry about engines per request: a background task refreshes the
table. When the registry cannot be reached the last good snapshot stays (engines do not
leave the pool just because the control plane is down).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC

from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_server.enginepool.table import EngineInfo, EngineTable, Role, Source

log = logging.getLogger(__name__)

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

    async def fetch(self) -> None:
        """One refresh; raises (the last snapshot kept) when the registry did not answer."""
        resp = await self.registry.list_engines(rpb.ListEnginesRequest(), timeout=self.timeout)
        self.table.apply_registry_snapshot(i for i in map(engine_info, resp.engines) if i is not None)

    async def refresh(self) -> bool:
        """One refresh; False (and the last snapshot kept) when the registry did not answer."""
        try:
            await self.fetch()
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
