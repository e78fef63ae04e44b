"""Prometheus metrics: one exposition endpoint per process, names prefixed `boomerang_`.

gRPC services expose `/metrics` on their own HTTP address (`BOOMERANG_METRICS_LISTEN`,
off when empty); the gateway serves it on its HTTP port. Latency histograms share one set
of buckets, fine enough to read a 1 ms p50 and a 5 ms p99.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import start_http_server

log = logging.getLogger(__name__)

# Seconds: 100 µs … 10 s, dense around the plan budget (1 ms p50, 5 ms p99).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


def serve_metrics(listen: str) -> int:
    """Start the `/metrics` HTTP endpoint on HOST:PORT (empty: don't); returns the bound port."""
    if not listen:
        return 0
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host)
    bound = int(server.server_address[1])
    print(f"BOOMERANG_METRICS {host}:{bound}", flush=True)
    return bound


async def refresh_forever(refresh: Callable[[], Awaitable[None]], interval: float) -> None:
    """Run `refresh` every `interval` seconds (gauges read from the database); never raises."""
    while True:
        try:
            await refresh()
        except Exception:
            log.debug("metrics refresh failed", exc_info=True)
        await asyncio.sleep(interval)
