"""Settings of the TTL-reaper service (`boomerang reaper`), from `BOOMERANG_*` variables and flags."""

from __future__ import annotations

from typing import Annotated, Any

from boomerang_server.config import Listen, RegistryClientSettings, check_listen
from boomerang_server.retention import Policy
from pydantic import Field, field_validator
from pydantic_settings import NoDecode


class ReaperSettings(RegistryClientSettings):
    """Settings of the TTL-reaper service (`boomerang reaper`)."""

    listen: Listen = Field(
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
    release_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="Seconds between retention-policy runs, which release retained turns unlikely to be pulled "
        "(idle past their tenant's policy, or the least valuable under a decode engine's memory pressure); 0: off.",
    )
    retention_policy: str = Field(
        default="p99",
        description="How long every tenant's idle turns are held: `pNN` (up to that percentile of the pauses "
        "between turns seen for the tenant and model, TTL-bound until retention_min_samples were seen), `ttl` "
        "(to the TTL; memory pressure may still release) or `off` (never released early).",
    )
    retention_tenant_policies: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Per-tenant policies overriding retention_policy, comma-separated `TENANT=POLICY`.",
    )
    retention_min_samples: int = Field(
        default=200, ge=1, le=1_000_000,
        description="Pauses a tenant and model must have shown before a percentile policy is trusted.",
    )
    retention_min_hold_seconds: float = Field(
        default=30.0, ge=0, le=86400, description="No percentile policy releases an idle turn sooner than this."
    )
    memory_pressure_free_share: float = Field(
        default=0.1, ge=0, le=1,
        description="A decode engine reporting a smaller free share of its KV blocks has its least valuable "
        "retained turns released until they would restore it; 0: never for pressure.",
    )
    retention_history_hours: float = Field(
        default=24.0, gt=0, le=8760, description="Hours of audit history the pauses between turns come from."
    )
    retention_evidence_seconds: float = Field(
        default=300.0, ge=1, le=86400, description="Seconds between re-reads of that history."
    )
    registry_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Deadline of each call to the registry."
    )

    @field_validator("registry_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_listen(value)

    @field_validator("retention_policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        return str(Policy.parse(value))

    @field_validator("retention_tenant_policies", mode="before")
    @classmethod
    def _tenant_policies(cls, value: Any) -> dict[str, str]:
        """`TENANT=POLICY` entries from a mapping or a comma-separated string, each policy
        checked."""
        items = value.items() if isinstance(value, dict) else (
            item.partition("=")[::2] for item in str(value or "").split(",") if item.strip())
        out: dict[str, str] = {}
        for tenant, policy in items:
            tenant, policy = str(tenant).strip(), str(policy).strip()
            if not tenant or not policy:
                raise ValueError(f"{tenant}={policy} must be TENANT=POLICY (POLICY: off, ttl or pNN)")
            out[tenant] = str(Policy.parse(policy))
        return out
