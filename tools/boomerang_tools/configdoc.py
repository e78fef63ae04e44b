"""The settings tables of docs/configuration.md, generated from the pydantic settings classes.

Each table sits between `<!-- settings: NAME -->` and `<!-- end settings -->` and is rewritten
from the classes' fields (name, default, bounds, description); the prose around the tables
is written by hand. `python -m boomerang_tools.configdoc` rewrites the file in place and
`--check` exits 1 when it is stale, so a setting documents itself once, in its `Field`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import annotated_types as at
from boomerang_gateway.settings import GatewaySettings
from boomerang_reaper.settings import ReaperSettings
from boomerang_registry.settings import RegistrySettings
from boomerang_router.settings import RouterSettings
from boomerang_server.config import CommonSettings, TelemetrySettings, env_name, flag_spec
from boomerang_server.config import render_default as render_value
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
COMMAND = "python -m boomerang_tools.configdoc"

# Each table, and the classes whose fields it lists. A service's table leaves out the
# settings it shares unchanged with every service (the `common` table); one it overrides
# (a different default) is listed again with its own.
TABLES: dict[str, tuple[type[BaseSettings], ...]] = {
    "common": (CommonSettings, TelemetrySettings),
    "registry": (RegistrySettings,),
    "router": (RouterSettings,),
    "gateway": (GatewaySettings,),
    "reaper": (ReaperSettings,),
}
TABLE = re.compile(r"(<!-- settings: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end settings -->)", re.DOTALL)


# Settings read by every service but set by no service's flags (only by their variable).
NO_FLAG = set(TelemetrySettings.model_fields)


def render_default(field: FieldInfo) -> str:
    """The default as an operator would type it into the variable."""
    value = render_value(field, empty="")
    return f"`{value}`" if value else "(none)"


def render_flag(name: str, field: FieldInfo) -> str:
    """The setting's flag on its service's command (`boomerang <service> --flag`)."""
    return "" if name in NO_FLAG else f"`{flag_spec(name, field).name}`"


BOUNDS: dict[type, Callable[[Any], str]] = {
    at.Ge: lambda m: f"≥ {m.ge}",
    at.Gt: lambda m: f"> {m.gt}",
    at.Le: lambda m: f"≤ {m.le}",
    at.Lt: lambda m: f"< {m.lt}",
    at.MinLen: lambda m: f"length ≥ {m.min_length}",
    at.MaxLen: lambda m: f"length ≤ {m.max_length}",
}


def render_bounds(field: FieldInfo) -> str:
    """The bounds validation enforces at start-up, e.g. `≥ 0, ≤ 300`."""
    parts = [BOUNDS[type(m)](m) for m in field.metadata if type(m) in BOUNDS]
    return ", ".join(parts)


def shared_unchanged(name: str, field: FieldInfo) -> bool:
    """Whether `name` is a common setting with the common default (listed once, in `common`)."""
    common = CommonSettings.model_fields.get(name)
    return common is not None and common.default == field.default and common.default_factory == field.default_factory


def rows(name: str) -> list[str]:
    """The Markdown rows of table `name`."""
    out = ["| variable | flag | default | allowed | meaning |", "|---|---|---|---|---|"]
    for cls in TABLES[name]:
        for field_name, field in cls.model_fields.items():
            if name != "common" and shared_unchanged(field_name, field):
                continue
            if not field.description:
                raise ValueError(f"{cls.__name__}.{field_name} has no description: give its Field(description=...)")
            meaning = field.description.replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{env_name(field_name)}` | {render_flag(field_name, field)} | {render_default(field)} "
                       f"| {render_bounds(field)} | {meaning} |")
    return out


def render(text: str) -> str:
    """`text` with every marked table regenerated; an unknown or missing table is an error."""
    seen: set[str] = set()

    def table(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"{DOC.name}: unknown settings table {name!r} (known: {', '.join(TABLES)})")
        seen.add(name)
        return match[1] + "\n".join(rows(name)) + "\n" + match[4]

    result = TABLE.sub(table, text)
    if missing := [n for n in TABLES if n not in seen]:
        raise ValueError(f"{DOC.name} lacks the marker <!-- settings: {missing[0]} --> … <!-- end settings -->")
    return result


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/configuration.md, or with --check say whether it is current."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the settings")
    parser.add_argument("--path", type=Path, default=DOC, help=f"the file (default {DOC.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    text = args.path.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{args.path} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.path.write_text(new)
        print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
