"""Command-line flags derived from a service's settings class, and the helpers every service's CLI shares.

Each field of the settings class becomes one flag: `--field-name` (or the name its `Flag`
annotation gives), typed from the field's annotation, with the field's description, default
and variable as its help. A flag given on the command line overrides the variable; one not
given is left to the variable and then the default. So a setting is written once, in its
`Field`, and `boomerang <service> --help` cannot disagree with docs/configuration.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, get_origin

import uvloop
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from boomerang_server.config.fields import env_name, flag_spec, render_default
from boomerang_server.config.settings import load_settings

S = TypeVar("S", bound=BaseSettings)

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


__all__ = ["add_settings_flags", "flag_dest", "flag_help", "require_database", "run_async", "service_command",
           "settings_from_args"]
