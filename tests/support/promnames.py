"""Metric names: those the services export, and those a dashboard's PromQL refers to."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "boomerang.json"

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
}
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


def sample_names(name: str, kind: str) -> set[str]:
    """The sample names a metric family of `kind` exposes (a counter `x` exposes `x_total`)."""
    return {name + suffix for suffix in _SUFFIXES.get(kind, ("",))}


def exported_in_process() -> set[str]:
    """Every `boomerang_*` sample name the services' metric modules define."""
    import boomerang_reaper.metrics  # noqa: F401 - registers its metrics
    import boomerang_registry.metrics  # noqa: F401
    import boomerang_router.planner
    import boomerang_router.repository  # noqa: F401
    from boomerang_gateway.metrics import GatewayMetrics
    from prometheus_client import REGISTRY

    names: set[str] = set()
    for registry in (REGISTRY, GatewayMetrics().registry):
        for family in registry.collect():
            if family.name.startswith("boomerang_"):
                names |= sample_names(family.name, family.type)
    return names


def exported_in_text(exposition: str) -> set[str]:
    """The sample names a /metrics text exposition declares (by its `# TYPE` lines)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            family = name.removesuffix("_total") if kind == "counter" else name
            names |= sample_names(family, kind)
    return names


def dashboard() -> dict[str, Any]:
    """The Boomerang Grafana dashboard."""
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(board: dict[str, Any] | None = None) -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    board = board or dashboard()
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (identifiers outside braces and label lists)."""
    stripped = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    stripped = re.sub(r"\b(by|without)\s*\([^)]*\)", "", stripped)  # grouping labels
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # range selectors
    idents = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", stripped))
    return {i for i in idents if "_" in i and i not in _PROMQL_KEYWORDS}


def referenced(queries: Iterable[str]) -> set[str]:
    """All metric names the queries select."""
    out: set[str] = set()
    for q in queries:
        out |= metric_names(q)
    return out
