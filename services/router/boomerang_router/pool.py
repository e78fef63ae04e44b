"""The router's engine choice over the shared engine table: who is least busy.

Which engines may serve a turn (static or registry, dead, stale, without an HTTP base URL)
is `boomerang_server.enginepool`'s, shared with the gateway. The router adds load: what
engines report in heartbeats combined with what this router planned and has not yet seen
reported (taking the larger of each, since a heartbeat may or may not include the router's
latest turns). A prefill engine's load is its queued prompt tokens plus a weight per
in-flight turn; a decode engine's is its in-flight turns, ties going to the engine with the
least retained KV memory. It also reads each model's block size and each prefill engine's
recompute threshold from the engines, with defaults for engines that report none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from boomerang_server.enginepool import EngineInfo, EngineTable, Role, Source, parse_static
from boomerang_server.enginepool import PoolEntry as TableEntry

__all__ = ["EngineInfo", "EnginePool", "PoolEntry", "Role", "Source", "parse_static"]


@dataclass
class PoolEntry(TableEntry):
    """An engine with its availability and the router's own load accounting."""

    planned_turns: int = 0
    planned_prompt_tokens: int = 0
    load: float = 0.0


@dataclass
class EnginePool(EngineTable):
    """The engines plans may choose from, and how busy each is."""

    inflight_token_weight: int = 256
    default_block_size: int = 16
    default_threshold: int = 64
    _planned: dict[str, list[int]] = field(default_factory=dict)  # id → [turns, tokens]

    def candidates(self, model: str, role: Role) -> list[PoolEntry]:
        """Every engine of `role` for `model`, available or not, with its load."""
        return [self._score(e) for e in super().candidates(model, role)]

    def entries(self, model: str = "", role: Role | None = None) -> list[PoolEntry]:
        """The pool for ListEngines: static and registry engines, by role then id, with their load."""
        return [self._score(e) for e in super().entries(model, role)]

    def _score(self, entry: TableEntry) -> PoolEntry:
        turns, tokens = self._planned.get(entry.info.engine_id, (0, 0))
        in_flight = max(entry.info.in_flight, turns)
        if entry.info.role is Role.PREFILL:
            load = float(max(entry.info.queued_prompt_tokens, tokens) + self.inflight_token_weight * in_flight)
        else:
            load = float(in_flight)
        return PoolEntry(entry.info, entry.available, entry.unavailable_reason, entry.models, turns, tokens, load)

    def choose(self, model: str, role: Role) -> EngineInfo | None:
        """The least-loaded available engine of `role` for `model`, or None."""
        best: tuple[float, int, str] | None = None
        chosen: EngineInfo | None = None
        for entry in self.candidates(model, role):
            if not entry.available:
                continue
            info = entry.info
            retained = info.retained_blocks * (info.bytes_per_block or 1) if role is Role.DECODE else 0
            key = (entry.load, retained, info.engine_id)
            if best is None or key < best:
                best, chosen = key, info
        return chosen

    def available(self, engine_id: str, model: str, role: Role) -> EngineInfo | None:
        """The engine `engine_id` when plans may choose it for (`model`, `role`), else None."""
        for entry in super().candidates(model, role):
            if entry.info.engine_id == engine_id and entry.available:
                return entry.info
        return None

    def block_size(self, model: str) -> int:
        """Tokens per block of `model`'s decode engines (the most common), else the default."""
        sizes = Counter(
            e.info.block_size
            for e in self.registry.values()
            if e.info.role is Role.DECODE and e.info.model == model and e.info.block_size > 0
        )
        return sizes.most_common(1)[0][0] if sizes else self.default_block_size

    def threshold(self, prefill: EngineInfo) -> int:
        """The prefill engine's own `kv_recompute_threshold`, else the default."""
        return prefill.kv_recompute_threshold or self.default_threshold

    def add_planned(self, engine_id: str, turns: int, tokens: int) -> None:
        """Count (or, with negative numbers, uncount) turns planned on an engine."""
        slot = self._planned.setdefault(engine_id, [0, 0])
        slot[0] = max(0, slot[0] + turns)
        slot[1] = max(0, slot[1] + tokens)
        if slot == [0, 0]:
            del self._planned[engine_id]
