"""Configuration from `BOOMERANG_*` environment variables and command-line flags.

Every service reads one settings class; flags override the environment. Values are
validated at start-up; a bad one raises `InvalidSettings`, one line naming its flag and variable.

A setting is declared once, as a pydantic `Field`; its `BOOMERANG_*` variable, its command-line
flag and its row in docs/configuration.md are all read from that one declaration, so they
cannot drift apart. Each field of a settings class becomes one flag: `--field-name` (or the
name its `Flag` annotation gives), typed from the field's annotation, with the field's
description, default and variable as its help. A flag given on the command line overrides the
variable; one not given is left to the variable and then the default, so
`boomerang <service> --help` cannot disagree with docs/configuration.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_origin

import uvloop
from pydantic import AfterValidator, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BOOMERANG_"
S = TypeVar("S", bound=BaseSettings)


def normalize_database_url(url: str) -> str:
    """Accept `postgres://` and `postgresql://` URLs and select the asyncpg driver.

    A libpq multi-host URL (`postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write`)
    becomes the same hosts as `host` query parameters, the one multi-host form both asyncpg and
    SQLAlchemy read."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + _hosts_as_query(url[len(prefix) :])
    raise ValueError(
        "must be a PostgreSQL URL such as postgresql://user@127.0.0.1:5432/boomerang"
    )


def asyncpg_dsn(url: str) -> str:
    """`url` as plain asyncpg reads it: several hosts in the libpq form (`h1:p1,h2:p2`), since
    asyncpg keeps only the last of repeated `host` parameters (SQLAlchemy's form)."""
    rest = normalize_database_url(url)[len("postgresql+asyncpg://") :]
    netloc, _, tail = rest.partition("/")
    path, question, query = tail.partition("?")
    params = query.split("&") if question else []
    hosts = [p[len("host=") :] for p in params if p.startswith("host=")]
    if len(hosts) < 2:
        return "postgresql://" + rest
    others = "&".join(p for p in params if not p.startswith("host="))
    return f"postgresql://{netloc}{','.join(hosts)}/{path}" + (f"?{others}" if others else "")


def _hosts_as_query(rest: str) -> str:
    """`user@h1:p1,h2:p2/db?q` as `user@/db?host=h1:p1&host=h2:p2&q`; one host unchanged."""
    netloc, _, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return rest
    path, question, query = tail.partition("?")
    params = "&".join(f"host={h}" for h in hosts.split(",") if h)
    return f"{userinfo}{at}/{path}?{params}" + (f"&{query}" if question and query else "")


def check_listen(value: str) -> str:
    """`value` if it is HOST:PORT, else a ValueError that says what is expected."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:50051 (port 0 picks a free one)")
    return value


@dataclass(frozen=True)
class Flag:
    """A setting's flag when it is not `--field-name`: `Annotated[str, Flag("--registry")]`.

    `metavar` names the value in `--help` (e.g. `[NAME=]URL`).
    """

    name: str
    metavar: str | None = None


# A service's listen address (`--listen`, `BOOMERANG_LISTEN`), checked at start-up; each
# service's field gives its own default.
Listen = Annotated[str, Flag("--listen", "HOST:PORT"), AfterValidator(check_listen)]


def env_name(field_name: str) -> str:
    """The variable that sets `field_name`, e.g. `BOOMERANG_DB_POOL_SIZE`."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def flag_spec(field_name: str, field: FieldInfo) -> Flag:
    """The flag of setting `field_name`: its `Flag` annotation, else `--field-name`."""
    for meta in field.metadata:
        if isinstance(meta, Flag):
            return meta
    return Flag("--" + field_name.replace("_", "-"))


def render_default(field: FieldInfo, empty: str = "(none)") -> str:
    """The default as an operator would type it into the variable; `empty` when empty."""
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if value in ("", [], None):
        return empty
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

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
            name = ".".join(str(p) for p in err["loc"])
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


# -- flags ----------------------------------------------------------------------------------

# The value's name in --help, by type, where the field's `Flag` names none.
METAVARS: dict[Any, str] = {int: "N", float: "N", str: "VALUE"}


def flag_help(field_name: str, field: FieldInfo) -> str:
    """The help of a setting's flag: its description, then its default and variable, once each."""
    description = (field.description or "").rstrip()
    help_text = f"{description} (default: {render_default(field, empty='none')}; {env_name(field_name)})"
    return help_text.replace("%", "%%")  # argparse %-formats help texts


def add_settings_flags(parser: argparse.ArgumentParser, cls: type[BaseSettings]) -> None:
    """Add one flag per field of `cls` to `parser`, each defaulting to None (not given)."""
    group = parser.add_argument_group(
        "settings", "each flag overrides its BOOMERANG_* variable (docs/configuration.md)"
    )
    for name, field in cls.model_fields.items():
        spec = flag_spec(name, field)
        kwargs: dict[str, Any] = {"dest": flag_dest(spec.name), "default": None, "help": flag_help(name, field)}
        annotation = field.annotation
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction  # --x sets true, --no-x false
        elif get_origin(annotation) is list:
            kwargs.update(action="append", metavar=spec.metavar or "VALUE")
        elif get_origin(annotation) is dict:
            kwargs.update(action="append", metavar=spec.metavar or "KEY=VALUE")
        elif annotation in METAVARS:
            kwargs.update(metavar=spec.metavar or METAVARS[annotation])
            if annotation is not str:
                kwargs["type"] = annotation
        else:
            raise TypeError(f"{cls.__name__}.{name}: no flag for a {annotation!r}: make it bool, int, float, str, list or dict")
        group.add_argument(spec.name, **kwargs)


def flag_dest(flag: str) -> str:
    """Where argparse keeps a flag's value (`--registry` → `args.registry`), as it would by itself."""
    return flag.lstrip("-").replace("-", "_")


def settings_from_args(cls: type[S], args: argparse.Namespace) -> S:
    """`cls` from the environment and the flags `add_settings_flags` added and the user gave."""
    given: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        value = getattr(args, flag_dest(flag_spec(name, field).name), None)
        if value is not None and get_origin(field.annotation) is dict:
            # A repeated `--flag KEY=VALUE` is handed over in the variable's comma-separated
            # form, so the field's own validator reads flag and variable alike.
            value = ",".join(value)
        given[name] = value
    return load_settings(cls, **given)


def require_database(settings: Any, command: str) -> str:
    """The database URL `command` is to use; exits with an actionable message when none is configured."""
    try:
        return str(settings.require_database())
    except ValueError as exc:
        raise SystemExit(f"boomerang {command}: {exc}") from None


def run_async(coro: Awaitable[Any]) -> Any:
    """Run a service's main coroutine on uvloop."""
    return uvloop.run(coro)  # type: ignore[arg-type]


def service_command(name: str, help_text: str, cls: type[S], run: Callable[[S], Awaitable[Any]]
                    ) -> Callable[[argparse._SubParsersAction], None]:  # type: ignore[type-arg]
    """The `register(subparsers)` of `boomerang <name>`, a database-backed gRPC service: one flag
    per field of `cls`, then `run(settings)` until it stops."""

    def handle(args: argparse.Namespace) -> int:
        settings = settings_from_args(cls, args)
        require_database(settings, name)
        run_async(run(settings))
        return 0

    def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        parser = subparsers.add_parser(name, help=help_text)
        add_settings_flags(parser, cls)
        parser.set_defaults(handler=handle)

    return register
