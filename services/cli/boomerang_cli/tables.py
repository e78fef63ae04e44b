"""What the operator commands share: how to print it (where to read from: context.py).

`boomerang status` and `boomerang audit` build plain dicts (the `--json` output, printed
as is) and render them as rich tables for a person.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.table import Table


def iso(value: Timestamp | float) -> str | None:
    """An ISO-8601 UTC time (milliseconds) of a Timestamp or epoch seconds; None when unset (zero)."""
    if isinstance(value, Timestamp):
        if not value.seconds and not value.nanos:
            return None
        when: datetime = value.ToDatetime(tzinfo=UTC)
    elif not value:
        return None
    else:
        when = datetime.fromtimestamp(value, tz=UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: str | None) -> datetime | None:
    """The datetime of an `iso()` string."""
    return None if not value else datetime.fromisoformat(value)


def human_bytes(n: float | None) -> str:
    """1.5 GiB, 12.0 MiB, … ('' for None)."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""


def human_seconds(s: float | None) -> str:
    """0.8 ms, 12.3 s, 4m05s ('' for None)."""
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def percent(x: float | None) -> str:
    """12.5 % ('–' when undefined)."""
    return "–" if x is None else f"{x * 100:.1f} %"


def short_time(value: str | None) -> str:
    """HH:MM:SS.mmm of an ISO time."""
    return "" if not value else value[11:23]


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "") -> Any:
    """A rich table; numbers right-aligned."""
    rows = [list(r) for r in rows]
    t = Table(title=title, caption=caption or None, title_justify="left", caption_justify="left", expand=False)
    for i, col in enumerate(columns):
        numeric = bool(rows) and all(isinstance(r[i], (int, float)) or r[i] in ("", None) for r in rows)
        t.add_column(col, justify="right" if numeric else "left", overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else (f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)) for v in r])
    if not rows:
        t.add_row(*["–"] + [""] * (len(columns) - 1))
    return t


def emit(data: dict[str, Any], as_json: bool, render: Any) -> None:
    """Print `data` as JSON, or the renderables `render(data)` returns."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
        return

    console = Console(width=max(100, Console().width))
    for item in render(data):
        console.print(item)
        console.print()
