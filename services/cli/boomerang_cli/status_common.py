"""What both sources of `boomerang status` (the services' APIs, the database) compute alike."""

from __future__ import annotations

from typing import Any

from boomerang_server.config.settings import TelemetrySettings, load_settings


def saved_seconds(tokens: int) -> float:
    """Estimated prefill time `tokens` pulled tokens saved (BOOMERANG_PREFILL_MS_PER_TOKEN)."""
    return tokens * load_settings(TelemetrySettings).prefill_ms_per_token / 1000


def retained_rows(engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decode engines' retained blocks and bytes, by engine id."""
    return [
        {"engine_id": e["engine_id"], "blocks": e["retained_blocks"], "bytes": e["retained_bytes"]}
        for e in sorted(engines, key=lambda e: e["engine_id"])
        if e["role"] == "DECODE"
    ]
