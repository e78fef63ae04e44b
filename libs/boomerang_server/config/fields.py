"""What a setting's declaration says beyond its value: its variable, its flag and its default as text.

A setting is declared once, as a pydantic `Field`; its `BOOMERANG_*` variable, its command-line
flag (`boomerang_server.config.flags`) and its row in docs/configuration.md are all read from that one
declaration, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic.fields import FieldInfo

ENV_PREFIX = "BOOMERANG_"


@dataclass(frozen=True)
class Flag:
    """A setting's flag when it is not `--field-name`: `Annotated[str, Flag("--registry")]`.

    `metavar` names the value in `--help` (e.g. `[NAME=]URL`).
    """

    name: str
    metavar: str | None = None


def env_name(field_name: str) -> str:
    """The variable that sets `field_name`, e.g. `BOOMERANG_DB_POOL_SIZE`."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def flag_spec(field_name: str, field: FieldInfo) -> Flag:
    """The flag of setting `field_name`: its `Flag` annotation, else `--field-name`."""
    for meta in field.metadata:
        if isinstance(meta, Flag):
            return meta
    return Flag("--" + field_name.replace("_", "-"))


def default_value(field: FieldInfo) -> object:
    """The default of `field`, calling its factory if it has one."""
    return field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]


def render_default(field: FieldInfo, empty: str = "(none)") -> str:
    """The default as an operator would type it into the variable; `empty` when empty."""
    value = default_value(field)
    if value in ("", [], None):
        return empty
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
