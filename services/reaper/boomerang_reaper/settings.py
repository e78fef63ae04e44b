"""Settings of the TTL-reaper service (`boomerang reaper`), from `BOOMERANG_*` variables and flags."""

from __future__ import annotations

from typing import Annotated

from boomerang.config.fields import Flag
from boomerang.config.settings import RegistryClientSettings, check_listen
from pydantic import Field, field_validator


class ReaperSettings(RegistryClientSettings):
    """Settings of the TTL-reaper service (`boomerang reaper`)."""

    listen: Annotated[str, Flag("--listen", "HOST:PORT")] = Field(
        default="127.0.0.1:50053", description="gRPC listen address (port 0: a free one)."
    )
    db_pool_size: int = Field(default=4, ge=2, le=200, description="Connections per process.")
    replica_id: str = Field(
        default="", max_length=128, description="This replica's id; empty: host-pid-random."
    )
    election: str = Field(
        default="ttl-reaper", min_length=1, max_length=128, description="Leader-election name."
    )
    leader_lease_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=300,
        description="Leadership lapses this long after the last renewal (renewed every third).",
    )
    engine_heartbeat_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="Engines silent this long are marked dead, their leases invalidated; 0: off.",
    )
    engine_sweep_interval_seconds: float = Field(
        default=5.0, ge=0.1, le=3600, description="Seconds between engine-liveness sweeps."
    )
    retention_days: int = Field(
        default=30, ge=1, le=3650, description="Days of lease_events kept (whole days dropped)."
    )
    partition_days_ahead: int = Field(
        default=7, ge=0, le=60, description="Days ahead to create lease_events partitions for."
    )
    retention_interval_seconds: float = Field(
        default=3600.0, ge=1, le=86400, description="Seconds between retention runs."
    )
    expire_batch_size: int = Field(
        default=1000, ge=1, le=10000, description="Leases expired per ExpireLeases call."
    )
    coalesce_seconds: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="Least time between expiry calls (bounds calls/s; adds at most this lag).",
    )
    max_sleep_seconds: float = Field(
        default=30.0,
        ge=0.1,
        le=3600,
        description="Longest sleep without an expiry call (a backstop; deadlines wake it).",
    )
    registry_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Deadline of each call to the registry."
    )

    @field_validator("listen", "registry_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_listen(value)
