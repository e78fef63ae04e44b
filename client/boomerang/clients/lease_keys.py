"""Keeping a `LeaseSummary` current from the registry's WatchLeaseKeys stream.

`LeaseKeysThread` (a daemon thread, the prefill hook's; the gateway's asyncio twin is
`boomerang_gateway.lease_summary`) reads the stream into the summary and reconnects after a
pause when it ends. While the stream is down the summary is unknown (`LeaseSummary.lost`):
every prompt is a "maybe".
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from boomerang.leasekeys import LeaseSummary, unpack
from boomerang.v1 import registry_service_pb2 as rpb

log = logging.getLogger(__name__)
RETRY_SECONDS = 1.0


def apply(summary: LeaseSummary, message: rpb.WatchLeaseKeysResponse) -> None:
    """Apply one stream message to the summary."""
    keys = unpack(message.keys)
    if message.snapshot:
        summary.snapshot_part(keys, message.snapshot_complete, message.live_leases)
    else:
        summary.add(keys)


class LeaseKeysThread:
    """A daemon thread that keeps `summary` current from a blocking registry client."""

    def __init__(self, client: Any, summary: LeaseSummary, watcher: str, retry: float = RETRY_SECONDS):
        self.client = client  # a SyncRegistryClient
        self.summary = summary
        self.watcher = watcher
        self.retry = retry
        self._stop = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="boomerang-lease-keys", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the stream is cancelled; the thread ends)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream = self.client.watch_lease_keys(self.watcher)
                for message in self._stream:
                    apply(self.summary, message)
            except Exception as exc:  # noqa: BLE001 - any failure: the summary is unknown until the next snapshot
                if not self._stop.is_set():
                    log.info("boomerang: lease-keys watch ended (%s); retrying in %.1f s", exc, self.retry)
            self.summary.lost()
            self._stop.wait(self.retry)
