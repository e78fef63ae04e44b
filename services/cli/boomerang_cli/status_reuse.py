"""`boomerang status`'s reuse outcomes: planned against delivered reuse, and misses by reason.

They are the gateway's counters since it started (`--gateway`), which also see the turns the
router never planned (`TOKENIZE_FAILED`, `CONTROL_PLANE_DEGRADED`, …). A turn missed its
reuse when the plan reused nothing (its reason: `NO_LEASE`, `PREFIX_MISMATCH`, …) or when
the prefill engine reported fewer tokens than planned (`PREFILL_SHORTFALL`).
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from boomerang_cli.tables import percent

_GATEWAY = "boomerang_gateway_reuse_"


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def _summary(turns: int, prompt: int, planned: int, delivered: int, planned_reported: int,
             reported: int, misses: dict[str, int]) -> dict[str, Any]:
    missed = sum(misses.values())
    return {
        "turns": turns,
        "prompt_tokens": prompt,
        "planned_tokens": planned,
        "delivered_tokens": delivered,
        "reported_turns": reported,
        # Turns that got the reuse they were planned (and some reuse at all).
        "reuse_rate": _ratio(turns - missed, turns),
        # Delivered over planned, over the turns whose prefill engine reported a count.
        "delivery_rate": _ratio(delivered, planned_reported),
        "misses_by_reason": [{"reason": r, "turns": n} for r, n in sorted(misses.items(), key=lambda x: (-x[1], x[0]))],
    }


def outcomes_from_metrics(exposition: str) -> dict[str, Any]:
    """The outcomes from a gateway's `/metrics` text (its counters since it started)."""
    values: dict[str, float] = {}
    misses: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        if not family.name.startswith(_GATEWAY):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(_GATEWAY).removesuffix("_total")
            if name == "declined_turns":
                reason = sample.labels.get("reason", "UNSPECIFIED")
                misses[reason] = misses.get(reason, 0) + int(sample.value)
            else:
                values[name] = values.get(name, 0.0) + sample.value
    if "turns" not in values:
        raise ValueError("the gateway's /metrics has no boomerang_gateway_reuse_turns_total (an older gateway?)")
    turns = int(values["turns"])
    reported = turns - int(values.get("unreported_turns", 0))
    planned = int(values.get("planned_tokens", 0))
    out = _summary(turns, int(values.get("prompt_tokens", 0)), planned, int(values.get("delivered_tokens", 0)),
                   planned if reported == turns else 0, reported, misses)
    out["source"] = "gateway counters since it started"
    return out


async def gateway_outcomes(url: str, timeout: float) -> dict[str, Any]:
    """Fetch and read a gateway's `/metrics`; {"error": …} when it cannot be read."""
    base = url if "://" in url else f"http://{url}"
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            resp = await http.get(base.rstrip("/") + "/metrics")
            resp.raise_for_status()
        out = outcomes_from_metrics(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        return {"address": url, "error": str(exc) or type(exc).__name__}
    out["address"] = url
    return out


def render_rows(o: dict[str, Any]) -> tuple[list[list[Any]], list[list[Any]]]:
    """The summary row and the misses rows of the reuse-outcome tables."""
    summary = [[o["turns"], percent(o["reuse_rate"]), o["planned_tokens"], o["delivered_tokens"],
                percent(o["delivery_rate"]), f"{o['reported_turns']}/{o['turns']}"]]
    misses = [[m["reason"], m["turns"]] for m in o["misses_by_reason"]]
    return summary, misses
