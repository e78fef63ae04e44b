"""`boomerang router`: the routing service (its flags are RouterSettings' fields)."""

from __future__ import annotations

from boomerang_server.config import service_command

from boomerang_router.server import run
from boomerang_router.settings import RouterSettings

register = service_command("router", "run the router gRPC service (turn plans, engine choice)", RouterSettings, run)
