"""`boomerang registry`: the block-registry service (its flags are RegistrySettings' fields)."""

from __future__ import annotations

from boomerang_server.config import service_command

from boomerang_registry.server import run
from boomerang_registry.settings import RegistrySettings

register = service_command("registry", "run the block-registry gRPC service", RegistrySettings, run)
