"""Running an asyncio gRPC service: its start-up (tracing, migrations, the database engine,
metrics), health, reflection, telemetry, graceful drain, and the one place where
domain errors become gRPC statuses.

On SIGTERM or SIGINT every registered service reports NOT_SERVING at once (so load
balancers stop sending) but keeps serving for `drain_delay_seconds` (calls already on their
way still land); then new calls are refused, in-flight calls get `grace_seconds` to
finish, and the server stops. Once listening the process prints one line, `BOOMERANG_READY <name> <host:port>`,
that scripts and tests wait for (a port of 0 binds a free port, printed here).

Servicer methods are wrapped with `@rpc`: a `BoomerangError` is sent as its canonical code
with `google.rpc.ErrorInfo` (domain `boomerang.dev`, a stable reason) and, for bad input,
`google.rpc.BadRequest` field violations; a lost database becomes UNAVAILABLE; anything
else is logged and sent as INTERNAL without internals. A client reads them back with
`boomerang.grpcutil` (`from_rpc_error`).

Prometheus metrics: one exposition endpoint per process, names prefixed `boomerang_`.
gRPC services expose `/metrics` on their own HTTP address (`BOOMERANG_METRICS_LISTEN`,
off when empty); the gateway serves it on its HTTP port. Latency histograms share one set
of buckets, fine enough to read a 1 ms p50 and a 5 ms p99.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from boomerang.auth import TlsFiles
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import GRPC_CODES, grpc_channel_options
from boomerang.telemetry import grpc_server_interceptors, instrument_engine, setup_tracing
from google.protobuf import any_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from prometheus_client import start_http_server
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_server.config import CommonSettings
from boomerang_server.db import make_engine, upgrade, warm_pool

log = logging.getLogger(__name__)
ERROR_DOMAIN = "boomerang.dev"


# -- status translation ---------------------------------------------------------------


def to_status(err: BoomerangError) -> grpc.Status:
    """A rich gRPC status for a domain error."""
    code = GRPC_CODES[err.code]
    details = []
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata)
    details.append(info)
    if err.violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                    for v in err.violations
                ]
            )
        )
    packed = []
    for detail in details:
        any_msg = any_pb2.Any()
        any_msg.Pack(detail)
        packed.append(any_msg)
    proto = status_pb2.Status(code=getattr(code_pb2, code.name), message=err.message, details=packed)
    return rpc_status.to_status(proto)


PUSHBACK_KEY = "grpc-retry-pushback-ms"


def _is_database_outage(exc: BaseException) -> bool:
    """True for errors that mean Postgres is unreachable, not that the request is wrong."""
    # deferred: the database drivers load only in a server that meets an error; a server
    # without a database imports this module too
    import asyncpg
    import sqlalchemy.exc

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(
            seen,
            (
                OSError,
                ConnectionError,
                TimeoutError,
                asyncpg.exceptions.CannotConnectNowError,
                asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.InterfaceError,
                asyncpg.exceptions.AdminShutdownError,
                sqlalchemy.exc.DisconnectionError,
                sqlalchemy.exc.TimeoutError,
            ),
        ):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def error_for_exception(exc: BaseException) -> BoomerangError:
    """The domain error to report for any exception raised while serving."""
    if isinstance(exc, BoomerangError):
        return exc
    if _is_database_outage(exc):
        return BoomerangError(Code.UNAVAILABLE, "DATABASE_UNAVAILABLE", "the database is unreachable; retry later")
    log.exception("unexpected error while serving a call")
    return BoomerangError(Code.INTERNAL, "INTERNAL", "internal error; see the service log")


Req = TypeVar("Req")
Resp = TypeVar("Resp")


def rpc(method: Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]) -> Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """Wrap a servicer method so every failure leaves as a proper status.

    When the servicer has an `authorize(method_name, request, context)` coroutine, it runs
    first: authentication and authorization happen before validation or any work.
    """

    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            authorize = getattr(self, "authorize", None)
            if authorize is not None:
                await authorize(method.__name__, request, context)
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - this is the translation boundary
            error = error_for_exception(exc)
            status = to_status(error)
            if error.reason == "DATABASE_UNAVAILABLE":
                # The server's push-back that tells gRPC clients not to retry it (gRFC A6).
                # Clients retry UNAVAILABLE transparently (a restarting service is back in
                # milliseconds), but a database outage is not: three attempts with back-off only
                # turned each failing call into ~200–500 ms on a loaded box, past a plan's claim
                # deadline. The caller's own breaker and back-off handle an outage; the
                # channel's retries still cover the transport.
                pushback = (*status.trailing_metadata, (PUSHBACK_KEY, "-1"))
                status = status._replace(trailing_metadata=pushback)
            await context.abort_with_status(status)
            raise AssertionError("unreachable: abort_with_status raises")  # pragma: no cover

    return wrapper


def write_item_error(item: Any, exc: BaseException) -> None:
    """Set a batch result's `error_code`, `error_reason` and `error_message` to the failure
    `@rpc` would have answered the call alone with."""
    err = error_for_exception(exc)
    item.error_code = int(GRPC_CODES[err.code].value[0])  # what `from_code_number` reads back
    item.error_reason = err.reason
    item.error_message = err.message


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts(value: datetime | float | None) -> Timestamp | None:
    """A protobuf Timestamp for a datetime (naive: UTC) or epoch seconds; None for None.

    Built from the difference to the epoch: protobuf's `FromDatetime` costs about 7.5 µs
    (time zone and calendar work), this about 1.6, and every lease in an answer has four."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, tz=UTC)
    if value.tzinfo is None:  # as FromDatetime reads a naive datetime: UTC
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return Timestamp(seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1000)


# -- serving ---------------------------------------------------------------------------


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


async def open_database(settings: CommonSettings, name: str, warm: int,
                        prepare: Callable[[AsyncEngine], None] | None = None) -> AsyncEngine:
    """The first steps of database-backed service `boomerang-<name>`: tracing, the migrations
    (unless `migrate_on_start` is off), then its engine, `prepare`d (before any connection
    opens) and with `warm` connections open."""
    url = settings.require_database()
    setup_tracing(f"boomerang-{name}")
    if settings.migrate_on_start:
        await asyncio.to_thread(upgrade, url)
    engine = make_engine(url, settings.db_pool_size, f"boomerang-{name}")
    if prepare is not None:
        prepare(engine)
    instrument_engine(engine)
    await warm_pool(engine, min(warm, settings.db_pool_size))
    return engine


def host(name: str, settings: CommonSettings, listen: str, service: ServiceSpec,
         on_stop: Callable[[], Awaitable[None]],
         on_drain: Callable[[], Awaitable[None]] | None = None,
         max_message_bytes: int = ServerOptions.max_message_bytes) -> Hosted:
    """The last steps of database-backed gRPC service `name`: its `/metrics` endpoint, and
    `service` on `listen`, ready to serve."""
    serve_metrics(settings.metrics_listen)
    options = ServerOptions(
        name=name,
        listen=listen,
        grace_seconds=settings.grace_seconds,
        drain_delay_seconds=settings.drain_delay_seconds,
        max_message_bytes=max_message_bytes,
        interceptors=grpc_server_interceptors(),
    )
    return Hosted(options, [service], on_stop=on_stop, on_drain=on_drain)


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


# -- metrics ---------------------------------------------------------------------------

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
