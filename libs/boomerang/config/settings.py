"""Configuration from `BOOMERANG_*` environment variables and command-line flags.

Every service reads one settings class; flags override the environment. Values are
validated at start-up; a bad one raises `InvalidSettings`, one line naming its flag and variable.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from boomerang.config.fields import ENV_PREFIX, Flag, env_name, flag_spec


def normalize_database_url(url: str) -> str:
    """Accept `postgres://` and `postgresql://` URLs and select the asyncpg driver."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError(
        "must be a PostgreSQL URL such as postgresql://user@127.0.0.1:5432/boomerang"
    )


def sqlalchemy_database_url(url: str) -> str:
    """`url` as SQLAlchemy's asyncpg dialect takes it: a libpq multi-host URL
    (`postgresql://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`, which asyncpg itself
    reads as it is) becomes one `host=` query parameter per host."""
    url = normalize_database_url(url)
    scheme, _, rest = url.partition("://")
    netloc, _, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return url
    path, _, query = tail.partition("?")
    params = [f"host={h}" for h in hosts.split(",")] + ([query] if query else [])
    return f"{scheme}://{userinfo}{at}/{path}?{'&'.join(params)}"


def check_listen(value: str) -> str:
    """`value` if it is HOST:PORT, else a ValueError that says what is expected."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:50051 (port 0 picks a free one)")
    return value


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    # populate_by_name: a renamed setting (`fields.renamed`) is still set by its field name.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    database_url: Annotated[str, Flag("--database-url", "URL")] = Field(
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
    metrics_listen: Annotated[str, Flag("--metrics-listen", "HOST:PORT")] = Field(
        default="", description="HOST:PORT for the Prometheus /metrics endpoint; empty: off."
    )
    require_auth: bool = Field(
        default=False,
        description="Refuse calls without a client certificate or bearer token.",
    )
    insecure_allow_anonymous: bool = Field(
        default=False,
        description="Development only: serve callers without credentials even on a listener beyond "
        "loopback (gRPC: as trusted services; gateway: with --allow-anonymous).",
    )
    migrate_on_start: bool = Field(
        default=True, description="Apply database migrations when the service starts."
    )
    grpc_streams: bool = Field(
        default=False,
        description="Send the hot path's calls (PlanTurn, ClaimReuseBatch) as messages on long-lived "
        "streams (PlanTurnStream, ClaimReuseStream) instead of one unary call each.",
    )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return normalize_database_url(value) if value else value

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, value: str) -> str:
        return check_listen(value) if value else value

    def require_database(self) -> str:
        """The database URL, or a clear error when none is configured."""
        if not self.database_url:
            raise ValueError(
                "no database configured: set BOOMERANG_DATABASE_URL (or --database-url), "
                "e.g. postgresql://root@127.0.0.1:5432/boomerang"
            )
        return self.database_url


class RegistryClientSettings(CommonSettings):
    """Settings of a service that calls the block registry."""

    registry_address: Annotated[str, Flag("--registry", "HOST:PORT")] = Field(
        default="127.0.0.1:50051", description="HOST:PORT of the block registry (or its balancer)."
    )

    @field_validator("registry_address")
    @classmethod
    def _registry_address(cls, value: str) -> str:
        return check_listen(value) if value else value


class EnginePoolSettings(RegistryClientSettings):
    """Settings of a service that keeps a pool of engines read from the registry (router, gateway)."""

    heartbeat_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="A registry engine whose heartbeat has not advanced this long leaves the pool; 0: never.",
    )


S = TypeVar("S", bound=BaseSettings)


def _field_name(cls: type[BaseSettings], loc: str) -> str:
    """The field an error's location names: a renamed setting's errors name its variable."""
    for name, field in cls.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices) and loc in field.validation_alias.choices:
            return name
    return loc


class InvalidSettings(Exception):
    """Settings that failed validation, as one line naming each bad setting's flag and variable.

    Raised rather than printed, so the command that loaded them words the failure the way it
    words every other (`boomerang_cli.failures`: one line, exit status 1). Not a ValueError:
    callers that catch a ValueError of their own must not swallow it.
    """

    def __init__(self, problems: list[str]):
        self.problems = problems
        fix = "fix that flag or variable" if len(problems) == 1 else "fix those flags or variables"
        super().__init__(f"invalid configuration: {'; '.join(problems)}; {fix}")


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment plus non-None overrides; InvalidSettings if a value is bad."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = _field_name(cls, ".".join(str(p) for p in err["loc"]))
            field = cls.model_fields.get(name)
            flag = flag_spec(name, field).name if field is not None else "--" + name.replace("_", "-")
            problems.append(f"{env_name(name)} ({flag}): {err['msg'].removeprefix('Value error, ')}")
        raise InvalidSettings(problems) from None


class TelemetrySettings(BaseSettings):
    """Figures the metrics and `boomerang status` use to turn reused tokens into time."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    prefill_ms_per_token: float = Field(
        default=0.02061,
        ge=0,
        le=1000,
        description="Milliseconds of prefill compute per prompt token, to estimate the prefill "
        "time a pull saves (default: the qwen3-32b fit to AWS's table, `boomerang_tools.sim.costmodel`).",
    )
