"""`boomerang control-plane`: the registry and the router in one process, on one port, and
with `--gateway-listen` the gateway too.

As Mimir's and Loki's single-binary mode: each service keeps its own API (the registry's and
the router's gRPC on the shared listener, where the hooks, the reaper, the CLI and other
gateways reach them; the gateway's HTTP on its own), and the calls between them are in-process
calls (`LocalStub`, below): the router's into the registry (ClaimReuse,
CompleteTurn, ListEngines, …), and the gateway's into the router (PlanTurn, ReportTurn) and
the registry (engines, the live-lease summary). A plan through this gateway crosses no
network hop of Boomerang's; a hook's crosses one. Each service still runs alone (`boomerang
registry`, `router`, `gateway`) for a deployment that scales them apart. All read their
settings from the environment as they do alone; the listeners and the database come from
here, and `/metrics` (one registry of metrics for the process) from the registry's
`BOOMERANG_METRICS_LISTEN`.

On SIGTERM the gateway drains first (its turns still plan and report in-process), then the
registry and the router.

An in-process call goes through `LocalStub(servicer)` in place of the generated gRPC stub: the
same typed client (`RegistryClient(..., stub=...)`), the same servicer methods with their
validation, authorization and error translation, the same error a caller reads back
(`grpc.aio.AioRpcError` carrying the rich status in its trailing metadata), but no
serialization, no HTTP/2 and no second event-loop hop. The caller is authenticated as the
principal it is given (`service:router`), presented as a verified certificate name would be.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.telemetry import grpc_server_interceptors, setup_tracing
from boomerang_gateway import cli as gateway_cli
from boomerang_gateway import server as gateway_server
from boomerang_gateway.settings import GatewaySettings
from boomerang_registry import server as registry_server
from boomerang_registry.settings import RegistrySettings
from boomerang_router import server as router_server
from boomerang_router.settings import RouterSettings
from boomerang_server.config import load_settings, require_database, run_async
from boomerang_server.rpc.server import ServerOptions, serve_together

# Who the router and the gateway are to what they call in-process (as `service:` certificates).
ROUTER_PRINCIPAL = "service:router"
GATEWAY_PRINCIPAL = "service:gateway"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `control-plane` subcommand."""
    parser = subparsers.add_parser(
        "control-plane", help="run the registry and the router in one process on one port (in-process calls)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="gRPC listen address of both services (default: the registry's BOOMERANG_LISTEN, "
                        "127.0.0.1:50051; port 0: a free one)")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    parser.add_argument("--gateway-listen", metavar="HOST:PORT",
                        help="also serve the gateway (its other settings from BOOMERANG_* as `boomerang gateway` "
                        "reads them), calling the router and the registry in-process")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    registry = load_settings(RegistrySettings, database_url=args.database_url, listen=args.listen)
    require_database(registry, "control-plane")
    router = load_settings(RouterSettings, database_url=args.database_url, listen=registry.listen, metrics_listen="")
    gateway = None
    if args.gateway_listen is not None:
        gateway = load_settings(GatewaySettings, database_url=registry.database_url, listen=args.gateway_listen,
                                router_address=registry.listen, registry_address=registry.listen, metrics_listen="")
        gateway_cli.check(gateway)
    run_async(serve(registry, router, gateway))
    return 0


async def serve(registry_settings: RegistrySettings, router_settings: RouterSettings,
                gateway_settings: GatewaySettings | None = None) -> None:
    """Start the registry, then the router on it in-process, then the gateway on both; serve
    until SIGTERM (the gateway takes the signal and drains first)."""
    setup_tracing("boomerang-control-plane")  # first: the services' own calls then keep this name
    registry = await registry_server.start(registry_settings)
    servicer = registry.services[0].servicer
    local = RegistryClient("in-process", timeout=router_settings.report_timeout_seconds,
                           stub=LocalStub(servicer, ROUTER_PRINCIPAL))
    router = await router_server.start(router_settings, local)
    options = ServerOptions(
        name="control-plane",
        listen=registry_settings.listen,
        grace_seconds=max(registry_settings.grace_seconds, router_settings.grace_seconds),
        drain_delay_seconds=max(registry_settings.drain_delay_seconds, router_settings.drain_delay_seconds),
        max_message_bytes=max(registry_settings.max_message_bytes, router_settings.max_message_bytes),
        interceptors=grpc_server_interceptors(),
    )
    if gateway_settings is None:
        await serve_together(options, [registry, router])
        return
    router_servicer = router.services[0].servicer
    peers = gateway_server.Peers(
        lambda: RouterClient("in-process", gateway_settings.report_turn_timeout_seconds,
                             gateway_settings.plan_timeout_seconds, LocalStub(router_servicer, GATEWAY_PRINCIPAL)),
        lambda: RegistryClient("in-process", stub=LocalStub(servicer, GATEWAY_PRINCIPAL)),
    )
    gateway: asyncio.Future[None] | None = None

    def start_gateway() -> asyncio.Future[None]:  # once the gRPC listener is up (its READY line first)
        nonlocal gateway
        gateway = asyncio.ensure_future(gateway_server.serve(gateway_settings, peers))
        return gateway

    try:
        await serve_together(options, [registry, router], then=start_gateway)
    finally:
        if gateway is not None:
            gateway.cancel()
            await asyncio.gather(gateway, return_exceptions=True)
    if gateway is not None:
        gateway.result()  # a gateway that failed fails the command


# -- in-process calls ---------------------------------------------------------------------


class _Aborted(Exception):
    """A servicer ended the call with a status (`abort`, `abort_with_status`)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str | bytes], ...]):
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, trailing

    def rpc_error(self) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(*self.trailing), self.details)


class LocalContext:
    """What Boomerang's servicers use of `grpc.aio.ServicerContext`, for an in-process call."""

    def __init__(self, principal: str, timeout: float | None):
        self._principal = principal.encode()
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self._principal]}

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "in-process"

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise _Aborted(status.code, status.details, tuple(status.trailing_metadata or ()))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details, tuple(trailing_metadata or ()))


class _Stream:
    """A server-streaming call's answer: iterate it; `cancel` ends it."""

    def __init__(self, items: AsyncIterator[Any]):
        self._items = items

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._read()

    async def _read(self) -> AsyncIterator[Any]:
        try:
            async for item in self._items:
                yield item
        except _Aborted as aborted:
            raise aborted.rpc_error() from None

    def cancel(self) -> bool:
        asyncio.ensure_future(self._items.aclose())  # type: ignore[attr-defined]
        return True


class LocalStub:
    """A generated stub's shape (`stub.Method(request, timeout=…)`) over a local servicer."""

    def __init__(self, servicer: Any, principal: str):
        self._servicer = servicer
        self._principal = principal

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The call of servicer method `name`, made once and kept (later lookups find it set)."""
        call = self._call(getattr(self._servicer, name))
        setattr(self, name, call)
        return call

    def _call(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(method):
            def stream(request: Any, timeout: float | None = None, **_: Any) -> _Stream:
                return _Stream(method(request, LocalContext(self._principal, timeout)))
            return stream

        async def unary(request: Any, timeout: float | None = None, **_: Any) -> Any:
            try:
                return await asyncio.wait_for(method(request, LocalContext(self._principal, timeout)), timeout)
            except _Aborted as aborted:
                raise aborted.rpc_error() from None
            except TimeoutError:
                raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                           grpc.aio.Metadata(), "Deadline Exceeded") from None
        return unary
