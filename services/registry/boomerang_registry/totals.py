"""Per-engine retained-block totals, shared by ListEngines and Heartbeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.statements import RETAINED_SQL

Row = Mapping[Any, Any]  # a result row by column name (SQLAlchemy's RowMapping keys by str or Column)


class RetainedTotals:
    """Per-engine retained blocks, recomputed at most every `max_age` seconds.

    Summing live leases per engine on every ListEngines or Heartbeat grew with the number
    of leases (35 ms per call at 20,000); the totals are a load signal and a memory
    figure, so a value at most `max_age` old serves every caller from one scan.
    """

    def __init__(self, max_age: float = 2.0):
        self.max_age = max_age
        self.values: dict[str, int] = {}
        self.at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self, engine: AsyncEngine) -> dict[str, int]:
        """The totals, rescanned when older than `max_age` (one scan however many callers)."""
        if time.monotonic() - self.at < self.max_age:
            return self.values
        async with self._lock:
            if time.monotonic() - self.at >= self.max_age:
                async with engine.connect() as conn:
                    rows = await conn.execute(text(RETAINED_SQL))
                    self.values = {r.engine_id: int(r.blocks) for r in rows}
                self.at = time.monotonic()
        return self.values

    def with_totals(self, row: Row) -> Row:
        """The engine row with its `retained_blocks`."""
        return {**row, "retained_blocks": self.values.get(row["engine_id"], 0)}
