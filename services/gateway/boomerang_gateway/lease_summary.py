"""The gateway's copy of the registry's live-lease summary (`boomerang.leasekeys`), kept current
from WatchLeaseKeys on the event loop; reconnects after a pause when the stream ends."""

from __future__ import annotations

import asyncio
import logging

from boomerang.clients.registry import RegistryClient
from boomerang.leasekeys import RETRY_SECONDS, LeaseSummary, apply

log = logging.getLogger(__name__)


async def watch_forever(client: RegistryClient, summary: LeaseSummary, watcher: str, retry: float = RETRY_SECONDS) -> None:
    """Keep `summary` current until cancelled; unknown (every prompt a "maybe") while the stream is down."""
    while True:
        try:
            async for message in client.watch_lease_keys(watcher):
                apply(summary, message)
        except asyncio.CancelledError:
            summary.lost()
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the summary is unknown until the next snapshot
            log.info("lease-keys watch ended (%s); retrying in %.1f s", exc, retry)
        summary.lost()
        await asyncio.sleep(retry)
