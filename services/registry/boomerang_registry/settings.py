"""Settings of the block-registry service (`boomerang registry`), from `BOOMERANG_*` variables and flags."""

from __future__ import annotations

from boomerang_server.config import CommonSettings, Listen
from pydantic import Field


class RegistrySettings(CommonSettings):
    """Settings of the block-registry service."""

    listen: Listen = Field(
        default="127.0.0.1:50051", description="gRPC listen address (port 0: a free one)."
    )
    ttl_margin_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Seconds a lease ends before the decode node's own TTL.",
    )
    default_kv_ttl_seconds: int = Field(
        default=480, ge=1, le=86400, description="decoder_kv_blocks_ttl when an engine omits it."
    )
    max_blocks_per_lease: int = Field(default=262144, ge=1, description="Block ids per lease.")
    max_tokens_per_lease: int = Field(default=4_194_304, ge=1, description="Tokens per lease.")
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest gRPC message accepted."
    )
    db_tenant_role: str = Field(
        default="boomerang_service",
        description="Postgres role for tenant-scoped statements (row-level security); empty: off.",
    )
    group_commit_max_batch: int = Field(
        default=256, ge=1, le=10000, description="Registrations committed per transaction."
    )
    lease_keys_refresh_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="Seconds between the fresh snapshots of WatchLeaseKeys, which drop ended leases' keys.",
    )
