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
    require_auth: bool = Field(
        default=False,
        description="Refuse calls without a client certificate or bearer token.",
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
    db_tenant_role: str = Field(
        default="boomerang_service",
        description="Postgres role for tenant-scoped statements (row-level security); empty: off.",
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


from typing import Annotated  # noqa: E402 - kept with the gateway's settings

from pydantic_settings import NoDecode  # noqa: E402


def _split_urls(value: Any) -> list[str]:
    """A list of URLs from a list or a comma-separated string (the environment's form)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    urls = [str(u).strip().rstrip("/") for u in items if str(u).strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} must be an http:// or https:// base URL")
    return urls


class GatewaySettings(CommonSettings):
    """Settings of the OpenAI-compatible gateway (`boomerang gateway`)."""

    listen: str = Field(default="127.0.0.1:8000", description="HTTP listen address.")
    db_pool_size: int = Field(default=2, ge=1, le=200, description="Connections per process.")
    router_address: str = Field(
        default="127.0.0.1:50052", description="HOST:PORT of the router; empty: no router."
    )
    registry_address: str = Field(
        default="127.0.0.1:50051", description="HOST:PORT of the block registry (or its balancer)."
    )
    prefill_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Static prefill engines' base URLs, comma-separated."
    )
    decode_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Static decode engines' base URLs, comma-separated."
    )
    allow_anonymous: bool = Field(
        default=False, description="Serve requests without an API key as tenant `anonymous`."
    )
    tokenize_timeout_seconds: float = Field(
        default=1.0, gt=0, le=60, description="Deadline of the prefill engine's /tokenize."
    )
    plan_timeout_seconds: float = Field(
        default=0.25, gt=0, le=30, description="Deadline of PlanTurn; past it the turn recomputes."
    )
    report_turn_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Deadline of ReportTurn (sent after the response)."
    )
    control_plane_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        le=300,
        description="After a router failure, seconds to go straight to plain prefill→decode.",
    )
    engine_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Connect timeout to engines."
    )
    engine_timeout_seconds: float = Field(
        default=600.0, gt=0, le=86400, description="Longest wait for an engine's next bytes."
    )
    pool_refresh_seconds: float = Field(
        default=2.0, gt=0, le=3600, description="Seconds between refreshes of the gateway's engines and models."
    )
    heartbeat_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="A registry engine whose heartbeat has not advanced this long leaves the pool; 0: never.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)."
    )
    tenant_requests_per_second: float = Field(
        default=0.0, ge=0, description="Average requests per second per tenant (429 past it); 0: unlimited."
    )
    tenant_burst: int = Field(default=50, ge=1, le=100_000, description="Requests a tenant may send at once.")
    key_cache_seconds: float = Field(
        default=30.0, ge=0, le=3600, description="Seconds a verified API key is cached."
    )
    rewrite_remote_host: bool = Field(
        default=True,
        description="Set the prefill engine's kv_transfer_params.remote_host to the host the "
        "gateway reached it at (as vLLM's proxy does) before forwarding them to the decode engine.",
    )

    @field_validator("listen")
    @classmethod
    def _gateway_listen(cls, value: str) -> str:
        return _check_listen(value)

    @field_validator("router_address", "registry_address")
    @classmethod
    def _optional_address(cls, value: str) -> str:
        return _check_listen(value) if value else value

    @field_validator("prefill_urls", "decode_urls", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> list[str]:
        return _split_urls(value)


from typing import Annotated  # noqa: E402 - kept with the router's settings

from pydantic_settings import NoDecode  # noqa: E402


def _split_list(value: Any) -> Any:
    """`a,b` from an environment variable, or a list from flags."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class RouterSettings(CommonSettings):
    """Settings of the router service (`boomerang router`)."""

    listen: str = Field(default="127.0.0.1:50052", description="gRPC listen address.")
    registry_address: str = Field(
        default="127.0.0.1:50051", description="HOST:PORT of the block registry (or its balancer)."
    )
    claim_deadline_ms: float = Field(
        default=50.0,
        gt=0,
        le=60_000,
        description="Milliseconds a plan waits for the registry's claim before answering "
        "CONTROL_PLANE_DEGRADED.",
    )
    min_remaining_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=3600,
        description="Seconds a lease must still live when claimed, so the pull ends well "
        "before the registry's deadline (itself before the decode node's TTL).",
    )
    block_size: int = Field(
        default=16, ge=1, le=1024, description="Tokens per KV block when engines do not say."
    )
    kv_recompute_threshold: int = Field(
        default=64,
        ge=0,
        le=1_000_000,
        description="Fewest reusable tokens worth a pull when the prefill engine does not say.",
    )
    prefill_engines: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Static prefill engines, `URL` or `NAME=URL`, comma-separated."
    )
    decode_engines: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Static decode engines, `URL` or `NAME=URL`, comma-separated."
    )
    engine_refresh_seconds: float = Field(
        default=1.0, gt=0, le=3600, description="Seconds between engine-pool refreshes from the registry."
    )
    heartbeat_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="A registry engine whose heartbeat has not advanced this long leaves the pool; 0: never.",
    )
    health_check_seconds: float = Field(
        default=2.0, ge=0, le=3600, description="Seconds between static engines' /health probes; 0: off."
    )
    health_check_failures: int = Field(
        default=2, ge=1, le=100, description="Failed probes in a row before a static engine leaves the pool."
    )
    inflight_token_weight: int = Field(
        default=256, ge=0, description="Prompt tokens one in-flight turn counts as in prefill load."
    )
    plan_memory_seconds: float = Field(
        default=900.0, ge=1, le=86400, description="Seconds plans stay in memory for ReportTurn and retries."
    )
    plan_memory_max: int = Field(default=100_000, ge=100, description="Plans kept in memory at most.")
    max_prompt_tokens: int = Field(default=4_194_304, ge=1, description="Longest prompt accepted.")
    audit_flush_ms: float = Field(
        default=100.0, gt=0, le=60_000, description="Milliseconds between turn_plans batch writes."
    )
    audit_batch_size: int = Field(default=500, ge=1, le=1000, description="turn_plans rows per write.")
    audit_queue_max: int = Field(
        default=100_000, ge=1, description="Unwritten turn_plans rows kept before new ones are dropped."
    )
    breaker_failures: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="Registry failures in a row before plans stop asking for a while; 0: never stop.",
    )
    breaker_cooldown_seconds: float = Field(
        default=1.0, ge=0, le=600, description="Seconds plans stop asking a failing registry."
    )
    report_timeout_seconds: float = Field(
        default=5.0, gt=0, le=600, description="Deadline of each registry call ReportTurn makes."
    )
    remote_host_from_url: bool = Field(
        default=False,
        description="Register a decode handle's remote_host as the host of the decode engine's "
        "URL (as vLLM's proxy rewrites it) instead of the host D reported.",
    )
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest gRPC message accepted."
    )

    @field_validator("listen", "registry_address")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _check_listen(value)

    @field_validator("prefill_engines", "decode_engines", mode="before")
    @classmethod
    def _engines(cls, value: Any) -> Any:
        items = _split_list(value)
        for item in items or []:
            url = item.partition("=")[2] if "=" in item and "://" not in item.partition("=")[0] else item
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{item!r}: an engine is URL or NAME=URL, the URL starting with http://")
        return items


class TelemetrySettings(BaseSettings):
    """Figures the metrics and `boomerang status` use to turn reused tokens into time."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    prefill_ms_per_token: float = Field(
        default=0.02061,
        ge=0,
        le=1000,
        description="Milliseconds of prefill compute per prompt token, to estimate the prefill "
        "time a pull saves (default: the qwen3-32b fit to AWS's table, `boomerang.sim.costmodel`).",
    )
