"""`boomerang control-plane`: the registry and the router in one process, on one port, and
with `--gateway-listen` the gateway too.

As Mimir's and Loki's single-binary mode: each service keeps its own API (the registry's and
the router's gRPC on the shared listener, where the hooks, the reaper, the CLI and other
gateways reach them; the gateway's HTTP on its own), and the calls between them are in-process
calls (`boomerang_server.rpc.inprocess`): the router's into the registry (ClaimReuse,
CompleteTurn, ListEngines, …), and the gateway's into the router (PlanTurn, ReportTurn) and
the registry (engines, the live-lease summary). A plan through this gateway crosses no
network hop of Boomerang's; a hook's crosses one. Each service still runs alone (`boomerang
registry`, `router`, `gateway`) for a deployment that scales them apart. All read their
settings from the environment as they do alone; the listeners and the database come from
here, and `/metrics` (one registry of metrics for the process) from the registry's
`BOOMERANG_METRICS_LISTEN`.

On SIGTERM the gateway drains first (its turns still plan and report in-process), then the
registry and the router.
"""

from __future__ import annotations

import argparse
import asyncio

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
from boomerang_server.rpc.inprocess import LocalStub
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
