"""Running an asyncio gRPC service: health, reflection, telemetry, graceful drain.

On SIGTERM or SIGINT every registered service reports NOT_SERVING at once (so load
balancers stop sending) but keeps serving for `drain_delay_seconds` (calls already on their
way still land); then new calls are refused, in-flight calls get `grace_seconds` to
finish, and the server stops. Once listening the process prints one line, `BOOMERANG_READY <name> <host:port>`,
that scripts and tests wait for (a port of 0 binds a free port, printed here).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from boomerang.auth import TlsFiles
from boomerang.grpcutil import grpc_channel_options
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)


@dataclass
class ServiceSpec:
    """One gRPC service to host: its full name and how to add its servicer."""

    full_name: str
    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any


@dataclass
class ServerOptions:
    """How to run the server."""

    name: str
    listen: str
    grace_seconds: float = 10.0
    drain_delay_seconds: float = 1.0
    max_message_bytes: int = 16 * 1024 * 1024
    interceptors: Sequence[grpc.aio.ServerInterceptor] = field(default_factory=tuple)


@dataclass
class Hosted:
    """A service built and started, ready to be served (alone, or with others in one process)."""

    options: ServerOptions
    services: list[ServiceSpec]
    on_stop: Callable[[], Awaitable[None]] | None = None
    on_drain: Callable[[], Awaitable[None]] | None = None

    async def serve(self) -> None:
        """Serve it alone until SIGTERM/SIGINT."""
        await serve(self.options, self.services, self.on_stop, self.on_drain)


async def serve_together(options: ServerOptions, parts: Sequence[Hosted],
                         then: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Serve several started services on one listener; on a stop, drain them all, then stop
    them in the reverse of their order (a caller before what it calls). `then`: run once the
    listener is up, and stop when it ends, not on a signal (a caller in this process that
    handles the signals, and must drain first)."""

    async def drain() -> None:
        for part in parts:
            if part.on_drain is not None:
                await part.on_drain()

    async def stop() -> None:
        for part in reversed(parts):
            if part.on_stop is not None:
                await part.on_stop()

    await serve(options, [spec for part in parts for spec in part.services], stop, drain, then)


async def serve(
    options: ServerOptions,
    services: Sequence[ServiceSpec],
    on_stop: Callable[[], Awaitable[None]] | None = None,
    on_drain: Callable[[], Awaitable[None]] | None = None,
    then: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or, given `then`, until what it starts once the server
    listens ends), then drain and return.

    `on_drain` runs after the drain delay, just before the server stops taking calls: it
    should end long-lived streams, which would otherwise hold the stop for the whole grace.
    """
    server = grpc.aio.server(
        interceptors=list(options.interceptors),
        options=grpc_channel_options(options.max_message_bytes),
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for spec in services:
        spec.add(spec.servicer, server)
    names = [spec.full_name for spec in services]
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    tls = TlsFiles.from_env()
    if tls.enabled:
        try:
            port = server.add_secure_port(options.listen, tls.server_credentials())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{options.name}: cannot set up TLS: {exc}") from None
    else:
        port = server.add_insecure_port(options.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {options.listen}: address in use or not local")
    host = options.listen.rpartition(":")[0]
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    if then is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        then = stop.wait
    print(f"BOOMERANG_READY {options.name} {host}:{port}", flush=True)
    log.info("%s listening on %s:%d", options.name, host, port)
    try:
        await asyncio.wait([asyncio.ensure_future(then())])  # its outcome is its caller's to read
    finally:
        log.info("%s draining (grace %.1fs)", options.name, options.grace_seconds)
        await health_servicer.enter_graceful_shutdown()
        await asyncio.sleep(min(options.drain_delay_seconds, options.grace_seconds))
        if on_drain is not None:
            await on_drain()
        await server.stop(options.grace_seconds)
        if on_stop is not None:
            await on_stop()
        log.info("%s stopped", options.name)
