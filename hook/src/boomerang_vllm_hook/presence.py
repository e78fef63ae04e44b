"""An engine's presence in the registry: RegisterEngine at start, then periodic heartbeats.

Runs on the sender's background thread, never on vLLM's scheduler thread. The first time a
decode engine registers in this process it first invalidates whatever the registry still
holds under its engine id: a fresh vLLM process holds no blocks from before, and an
operator who pins `engine_id` would otherwise restart at the same generation and leave the
old process's handles looking live.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

log = logging.getLogger(__name__)

# Registry answers that mean "register the engine (again), then retry".
REREGISTER_REASONS = frozenset({"ENGINE_NOT_FOUND", "ENGINE_NOT_REGISTERED", "GENERATION_NOT_REGISTERED", "ENGINE_DEAD"})


@dataclass(frozen=True)
class EngineFacts:
    """What the registry records about this engine (from vLLM's config and the hook's)."""

    engine_id: str
    role: Literal["prefill", "decode"]
    model: str
    block_size: int
    kv_blocks_ttl_seconds: int
    kv_recompute_threshold: int
    side_channel_host: str = ""
    side_channel_port: int = 0
    http_base_url: str = ""
    generation: int = 0
    tp_size: int = 1
    dcp_size: int = 1
    pp_size: int = 1

    def engine_proto(self, generation: int) -> tpb.Engine:
        """The Engine message for RegisterEngine at `generation`."""
        return tpb.Engine(
            engine_id=self.engine_id,
            role=tpb.ENGINE_ROLE_DECODE if self.role == "decode" else tpb.ENGINE_ROLE_PREFILL,
            model=self.model,
            side_channel_host=self.side_channel_host,
            side_channel_port=self.side_channel_port,
            http_base_url=self.http_base_url,
            registration_generation=generation,
            kv_blocks_ttl_seconds=self.kv_blocks_ttl_seconds,
            block_size=self.block_size,
            tp_size=self.tp_size,
            dcp_size=self.dcp_size,
            pp_size=self.pp_size,
            kv_recompute_threshold=self.kv_recompute_threshold,
        )


Load = Callable[[], tuple[int, int]]
Memory = Callable[[], tuple[int, int]]  # (free KV blocks, total KV blocks); (0, 0) unknown
OnReleased = Callable[[list[str]], None]


class EnginePresence:
    """Keeps the engine registered at its current generation and heartbeating."""

    def __init__(
        self,
        client: SyncRegistryClient,
        facts: EngineFacts,
        *,
        rpc_timeout: float,
        heartbeat_interval: float,
        load: Load | None = None,
        clock: Callable[[], float] = time.monotonic,
        memory: Memory | None = None,
        on_released: OnReleased | None = None,
    ):
        self.client = client
        self.facts = facts
        self.rpc_timeout = rpc_timeout
        self.heartbeat_interval = heartbeat_interval
        self.load = load or (lambda: (0, 0))
        self.memory = memory or (lambda: (0, 0))
        # A decode engine's hook takes its releases in its heartbeats' answers.
        self.on_released = on_released if facts.role == "decode" else None
        self.released = 0
        self.clock = clock
        self.generation = facts.generation
        self.registered = False
        self.superseded = False  # someone registered a newer generation of this engine id
        self.registrations = 0
        self.heartbeats = 0
        self.failures = 0
        self._cleaned = facts.role != "decode"
        self._next_heartbeat = 0.0
        self._retry_at = 0.0
        self._backoff = 0.05
        self._lock = threading.Lock()
        self._start_nonce = uuid.uuid4().hex
        self._last_failure: tuple[str, str] = ("", "")

    def advance(self, generation: int) -> None:
        """A handle arrived from a newer memory-registration generation: register it."""
        with self._lock:
            if generation > self.generation:
                self.generation = generation
                self.registered = False
                self._retry_at = 0.0

    def seconds_to_heartbeat(self) -> float:
        """How long the sender may wait for work before the next heartbeat is due."""
        return max(0.0, self._next_heartbeat - self.clock())

    def tick(self) -> bool:
        """Register or heartbeat when due; True when the engine is registered at its generation."""
        now = self.clock()
        if self.superseded:
            return False
        if not self.registered:
            if now < self._retry_at:
                return False
            return self._register(now)
        if now >= self._next_heartbeat:
            self._heartbeat(now)
        return self.registered

    def _fail(self, now: float, what: str, err: BoomerangClientError) -> None:
        self.failures += 1
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, 5.0)
        # Once per distinct failure, not every retry: a registry down for an hour is one line.
        if (what, err.reason) != self._last_failure:
            self._last_failure = (what, err.reason)
            log.warning("boomerang: %s failed for engine %s (retrying): %s", what, self.facts.engine_id, err)

    def _register(self, now: float) -> bool:
        generation = self.generation
        try:
            if not self._cleaned:
                self._invalidate_previous()
                self._cleaned = True
            self.client.register_engine(
                rpb.RegisterEngineRequest(
                    engine=self.facts.engine_proto(generation),
                    request_id=f"{self.facts.engine_id}:{generation}:{self._start_nonce}",
                ),
                timeout=self.rpc_timeout,
            )
        except BoomerangClientError as err:
            if err.reason == "STALE_GENERATION":
                self.superseded = True
                log.error(
                    "boomerang: engine %s: the registry holds a newer generation than %d; another "
                    "process uses this engine id, so this one registers nothing", self.facts.engine_id, generation,
                )
            self._fail(now, "RegisterEngine", err)
            return False
        with self._lock:
            self.registered = generation == self.generation
        self.registrations += 1
        self._backoff = 0.05
        self._last_failure = ("", "")
        self._next_heartbeat = now + self.heartbeat_interval
        log.info("boomerang: registered %s engine %s at generation %d", self.facts.role, self.facts.engine_id, generation)
        return self.registered

    def _invalidate_previous(self) -> None:
        try:
            self.client.invalidate_engine(
                rpb.InvalidateEngineRequest(
                    engine_id=self.facts.engine_id,
                    reason="ENGINE_RESTARTED",
                    request_id=f"{self.facts.engine_id}:restart:{self._start_nonce}",
                ),
                timeout=self.rpc_timeout,
            )
        except BoomerangClientError as err:
            if err.code == "PERMISSION_DENIED":
                # An engine credential may not invalidate (a service's job); with vLLM's default
                # random engine ids a restarted process has a new id and nothing to clean.
                log.warning("boomerang: cannot invalidate engine %s's earlier leases: %s", self.facts.engine_id, err)
            elif err.code != "NOT_FOUND":
                raise

    def _heartbeat(self, now: float) -> None:
        self._next_heartbeat = now + self.heartbeat_interval
        in_flight, queued = self.load()
        free, total = self.memory()
        try:
            answer = self.client.heartbeat(
                rpb.HeartbeatRequest(
                    engine_id=self.facts.engine_id,
                    registration_generation=self.generation,
                    in_flight_requests=max(0, in_flight),
                    queued_prompt_tokens=max(0, queued),
                    free_kv_blocks=max(0, min(free, total)) if total > 0 else 0,
                    total_kv_blocks=max(0, total),
                    take_releases=self.on_released is not None,
                ),
                timeout=self.rpc_timeout,
            )
            self.heartbeats += 1
            if answer.released and self.on_released is not None:
                self.released += len(answer.released)
                self.on_released([r.remote_request_id for r in answer.released])
        except BoomerangClientError as err:
            self.failures += 1
            if err.reason in REREGISTER_REASONS:
                with self._lock:
                    self.registered = False  # e.g. the registry's database was rebuilt
            elif err.reason == "STALE_GENERATION":
                self.superseded = True
            log.warning("boomerang: Heartbeat failed for engine %s: %s", self.facts.engine_id, err)

    def reregister(self) -> None:
        """The registry no longer knows this engine at its generation: register again."""
        with self._lock:
            self.registered = False
            self._retry_at = 0.0
