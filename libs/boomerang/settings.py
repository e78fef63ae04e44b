"""Configuration from `BOOMERANG_*` environment variables and command-line flags.

Every service reads one settings class; flags override the environment. Values are
validated at start-up and a bad one stops the process with a message naming the variable.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BOOMERANG_"


def normalize_database_url(url: str) -> str:
    """Accept `postgres://` and `postgresql://` URLs and select the asyncpg driver."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError(
        "must be a PostgreSQL URL such as postgresql://user@127.0.0.1:5432/boomerang"
    )


def _check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:50051 (port 0 picks a free one)")
    return value


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    database_url: str = Field(
        default="",
        description="PostgreSQL URL, e.g. postgresql://root@127.0.0.1:5432/boomerang.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200, description="Connections per process.")
    grace_seconds: float = Field(
        default=10.0, ge=0, le=300, description="Seconds to finish in-flight calls on SIGTERM."
    )
    drain_delay_seconds: float = Field(
        default=1.0, ge=0, le=60, description="Seconds to keep serving after reporting NOT_SERVING."
    )
    log_level: str = Field(default="INFO", description="Python logging level.")
    metrics_listen: str = Field(
        default="", description="HOST:PORT for the Prometheus /metrics endpoint; empty: off."
    )
    migrate_on_start: bool = Field(
        default=True, description="Apply database migrations when the service starts."
    )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return normalize_database_url(value) if value else value

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, value: str) -> str:
        return _check_listen(value) if value else value

    def require_database(self) -> str:
        """The database URL, or a clear error when none is configured."""
        if not self.database_url:
            raise ValueError(
                "no database configured: set BOOMERANG_DATABASE_URL (or --database-url), "
                "e.g. postgresql://root@127.0.0.1:5432/boomerang"
            )
        return self.database_url


class RegistrySettings(CommonSettings):
    """Settings of the block-registry service."""

    listen: str = Field(default="127.0.0.1:50051", description="gRPC listen address.")
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
    group_commit_max_batch: int = Field(
        default=256, ge=1, le=10000, description="Registrations committed per transaction."
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _check_listen(value)


S = TypeVar("S", bound=BaseSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment plus non-None overrides, or exit with a clear message."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        lines = ["invalid configuration:"]
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {ENV_PREFIX}{name.upper()} (--{name.replace('_', '-')}): {err['msg']}")
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


class ReaperSettings(CommonSettings):
    """Settings of the TTL-reaper service (`boomerang reaper`)."""

    listen: str = Field(default="127.0.0.1:50053", description="gRPC listen address.")
    db_pool_size: int = Field(default=4, ge=2, le=200, description="Connections per process.")
    registry_address: str = Field(
        default="127.0.0.1:50051", description="HOST:PORT of the block registry (or its balancer)."
    )
    replica_id: str = Field(
        default="", max_length=128, description="This replica's id; default host-pid-random."
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
        return _check_listen(value)
