"""`boomerang control-plane`: the registry and the router in one process, on one port.

As Mimir's and Loki's single-binary mode: each service keeps its own gRPC API on the shared
listener (the gateway, the hooks, the reaper and the CLI reach both at that one address), and
the router's calls into the registry (ClaimReuse, CompleteTurn, ListEngines, …) are in-process
calls (`boomerang_server.rpc.inprocess`): a plan crosses one network hop, the caller's, not
two. Each service still runs alone (`boomerang registry`, `boomerang router`) for a deployment
that scales them apart. Both read their settings from the environment as they do alone; the
listener and the database come from here, and `/metrics` (one registry of metrics for the
process) from the registry's `BOOMERANG_METRICS_LISTEN`.
"""

from __future__ import annotations

import argparse
from typing import Any

from boomerang.clients.registry import RegistryClient
from boomerang.telemetry import grpc_server_interceptors, setup_tracing
from boomerang_registry import server as registry_server
from boomerang_registry.settings import RegistrySettings
from boomerang_router import server as router_server
from boomerang_router.settings import RouterSettings
from boomerang_server.config.flags import require_database, run_async
from boomerang_server.rpc.inprocess import LocalStub
from boomerang_server.rpc.server import ServerOptions, serve_together

# Who the router is to the registry it calls in-process (as a `service:router` certificate).
ROUTER_PRINCIPAL = "service:router"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `control-plane` subcommand."""
    parser = subparsers.add_parser(
        "control-plane", help="run the registry and the router in one process on one port (in-process calls)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="gRPC listen address of both services (default: the registry's BOOMERANG_LISTEN, "
                        "127.0.0.1:50051; port 0: a free one)")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    given: dict[str, Any] = {"database_url": args.database_url} if args.database_url is not None else {}
    if args.listen is not None:
        given["listen"] = args.listen
    registry = RegistrySettings(**given)
    require_database(registry, "control-plane")
    router = RouterSettings(**{**given, "listen": registry.listen, "metrics_listen": ""})
    run_async(serve(registry, router))
    return 0


async def serve(registry_settings: RegistrySettings, router_settings: RouterSettings) -> None:
    """Start the registry, then the router on it in-process; serve both until SIGTERM."""
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
    await serve_together(options, [registry, router])
