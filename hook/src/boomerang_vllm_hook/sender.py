"""An engine's link to the registry, off vLLM's scheduler thread: its presence and, on a
decode engine, its retained turns.

One daemon thread (`RegistrationSender`, an `outbox.OutboxWorker`) keeps the engine
registered and heartbeating (`EnginePresence`: RegisterEngine at start, then periodic
heartbeats) and drains the queue of retained turns. The first time a decode engine
registers in this process it first invalidates whatever the registry still holds under its
engine id: a fresh vLLM process holds no blocks from before, and an operator who pins
`engine_id` would otherwise restart at the same generation and leave the old process's
handles looking live.

`submit` is all the scheduler thread does (a deque append under a lock). The thread builds
each turn's token chain and sends up to `batch_size` of them as one
RegisterRetainedBlocksBatch call (the registry group-commits them). An answer that the
registry no longer knows this engine at this generation registers it, then retries; a
registration refused otherwise (a stale generation, a bad request, another conversation's
request id) is dropped and counted by reason.

Retries are safe because a registration is idempotent on (engine id, generation,
remote_request_id) in the registry, and its `request_id` is derived from the same triple.
A turn is abandoned only at its deadline: D's own expiry of the blocks (its
`remote_blocks_expiry_time`), after which a lease would be useless anyway.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient
from boomerang.resilience import Backoff
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_vllm_hook.config import HookConfig
from boomerang_vllm_hook.outbox import Entry, OutboxWorker
from boomerang_vllm_hook.requestview import RetainedHandle, TurnContext

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



def _first(*values: Any) -> Any:
    for value in values:
        if value not in (None, "", 0):
            return value
    return None


def engine_facts(vllm_config: Any, config: HookConfig, scheduler: Any = None) -> EngineFacts:
    """What to register, read from vLLM's config (duck-typed) with the hook's overrides."""
    b = config.boomerang
    kv = getattr(vllm_config, "kv_transfer_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    model_cfg = getattr(vllm_config, "model_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    engine_id = getattr(kv, "engine_id", None) or getattr(scheduler, "engine_id", None)
    if not engine_id:
        raise ValueError("kv_transfer_config.engine_id is not set; the hook cannot name this engine")
    served = getattr(model_cfg, "served_model_name", None)
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    model = _first(b.model, served, getattr(model_cfg, "model", None))
    if not model:
        raise ValueError("no served model name; set kv_connector_extra_config.boomerang.model")
    dp_rank = int(getattr(parallel, "data_parallel_rank", 0) or 0)
    # vLLM's NIXL side channel: VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, the port offset by DP rank.
    host = _first(
        b.side_channel_host,
        getattr(scheduler, "side_channel_host", None),
        os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST"),
        "localhost",
    )
    port = _first(
        b.side_channel_port,
        getattr(scheduler, "side_channel_port", None),
        int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")) + dp_rank,
    )
    generation = _first(
        getattr(scheduler, "registration_generation", None),
        getattr(scheduler, "_registration_generation", None),
        b.registration_generation,
    )
    return EngineFacts(
        engine_id=str(engine_id),
        role=b.role,
        model=str(model),
        block_size=int(getattr(cache, "block_size", 16) or 16),
        kv_blocks_ttl_seconds=config.decoder_kv_blocks_ttl,
        kv_recompute_threshold=config.kv_recompute_threshold,
        side_channel_host=str(host),
        side_channel_port=int(port),
        http_base_url=b.http_base_url,
        generation=int(generation or 0),
        tp_size=int(getattr(parallel, "tensor_parallel_size", 1) or 1),
        dcp_size=int(getattr(parallel, "decode_context_parallel_size", 1) or 1),
        pp_size=int(getattr(parallel, "pipeline_parallel_size", 1) or 1),
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
        self._backoff = Backoff(0.05, 5.0)
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
        self._retry_at = now + self._backoff.next()
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
        self._backoff.reset()
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


IDEMPOTENCY_NAMESPACE = uuid.UUID("b0e7a1f2-5c3d-4e8f-9a6b-7c2d1e0f3a4b")


def idempotency_key(engine_id: str, generation: int, remote_request_id: str) -> str:
    """The registration's request id: the same for every retry, from any process."""
    return str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{engine_id}\x00{generation}\x00{remote_request_id}"))


@dataclass(frozen=True)
class Registration:
    """One finished decode request whose blocks D keeps: what to tell the registry."""

    context: TurnContext
    handle: RetainedHandle
    token_ids: tuple[int, ...]  # exactly the tokens whose KV D holds (prompt + output)
    finish_time_unix: float


class RegistrationSender(OutboxWorker[Registration]):
    """Owns the background thread that registers the engine and its retained turns."""

    rpc = "RegisterRetainedBlocksBatch"

    def __init__(
        self,
        client: SyncRegistryClient,
        facts: EngineFacts,
        *,
        queue_size: int = 10_000,
        when_full: Literal["drop_oldest", "reject_new"] = "drop_oldest",
        batch_size: int = 64,
        rpc_timeout: float = 2.0,
        heartbeat_interval: float = 5.0,
        load: Load | None = None,
        clock: Callable[[], float] = time.perf_counter,
        memory: Memory | None = None,
        on_released: OnReleased | None = None,
    ):
        # perf_counter: the clock of D's `remote_blocks_expiry_time`, which sets the deadlines.
        super().__init__(f"boomerang-sender-{facts.engine_id}", client, queue_size=queue_size,
                         when_full=when_full, batch_size=batch_size, rpc_timeout=rpc_timeout,
                         clock=clock)
        self.facts = facts
        self.presence = EnginePresence(
            client, facts, rpc_timeout=rpc_timeout, heartbeat_interval=heartbeat_interval, load=load, clock=clock,
            memory=memory, on_released=on_released,
        )
        self.registered = 0
        self.duplicates = 0
        self.stale = 0

    # -- the scheduler thread's side -----------------------------------------------------

    def submit(self, registration: Registration, deadline: float) -> bool:
        """Queue a retained turn until `deadline` (on `clock`); never blocks."""
        return self.outbox.offer(registration, deadline)

    def snapshot(self) -> dict[str, Any]:
        """Counters for logs and tests."""
        return {
            **super().snapshot(),
            "offered": self.outbox.stats.offered,
            "registered": self.registered,
            "duplicates": self.duplicates,
            "stale": self.stale,
            "engine_registrations": self.presence.registrations,
            "heartbeats": self.presence.heartbeats,
            "releases_taken": self.presence.released,
            "engine_registered": self.presence.registered,
            "generation": self.presence.generation,
        }

    # -- the background thread -----------------------------------------------------------

    def _wait(self) -> float | None:
        """Register or heartbeat when due; with the engine registered, wait for work until
        the next heartbeat."""
        if self.presence.tick():
            return min(self.presence.seconds_to_heartbeat(), 0.5)
        if self.presence.superseded:
            dropped = self.outbox.take(self.batch_size, timeout=0)
            if dropped:
                self.rejected["ENGINE_SUPERSEDED"] += len(dropped)
                self.outbox.done(len(dropped))  # taken only to be dropped: nothing left for flush to wait on
        self._stop.wait(0.02)
        return None

    def _prepare(self, entry: Entry[Registration]) -> rpb.RegisterRetainedBlocksRequest:
        reg = entry.item
        generation = self.presence.generation if reg.handle.generation is None else reg.handle.generation
        chain = build_chain(reg.token_ids, self.facts.block_size, reg.context.salt)
        # Where the prompt ends, so the next turn finds this one without a conversation id.
        prompt = reg.context.prompt_tokens if 0 < reg.context.prompt_tokens <= chain.num_tokens else 0
        tail = prompt % chain.block_size
        return rpb.RegisterRetainedBlocksRequest(
            tenant=reg.context.tenant,
            conversation_id=reg.context.conversation_id,
            engine_id=reg.handle.engine_id,
            engine_generation=generation,
            remote_request_id=reg.handle.remote_request_id,
            block_groups=[tpb.BlockIdGroup(block_ids=g) for g in reg.handle.block_groups],
            num_tokens=chain.num_tokens,
            token_chain=chainproto.to_proto(chain),
            finish_time_unix=reg.finish_time_unix,
            remote_host=reg.handle.remote_host,
            remote_port=reg.handle.remote_port,
            model=self.facts.model,
            request_id=idempotency_key(reg.handle.engine_id, generation, reg.handle.remote_request_id),
            prompt_tokens=prompt,
            prompt_tail_token_ids=reg.token_ids[prompt - tail : prompt] if tail else (),
        )

    def _ready(self, batch: list[Entry[Registration]]) -> tuple[list[Entry[Registration]], bool]:
        """The round's registrations built (once) and at the engine's generation; none while
        the engine registers at a new generation first."""
        ready: list[Entry[Registration]] = []
        for entry in batch:
            if entry.prepared is None:
                try:
                    entry.prepared = self._prepare(entry)
                except ValueError as exc:  # token ids out of range, block size out of range
                    self.rejected["BAD_TOKENS"] += 1
                    log.warning("boomerang: cannot register %s: %s", entry.item.handle.remote_request_id, exc)
                    continue
            generation = entry.prepared.engine_generation
            if generation > self.presence.generation:
                self.presence.advance(generation)
            elif generation < self.presence.generation:
                self.stale += 1  # vLLM re-registered its memory since: the handle is dead
                continue
            ready.append(entry)
        if not self.presence.registered:
            self.outbox.retry(ready)  # the engine registers at the new generation first
            return [], True
        return ready, True

    def _batch_future(self, chunk: list[Entry[Registration]]) -> Any:
        request = rpb.RegisterRetainedBlocksBatchRequest(registrations=[e.prepared for e in chunk])
        return self.client.register_retained_blocks_batch_future(request, timeout=self.rpc_timeout)

    def _label(self, entry: Entry[Registration]) -> str:
        return str(entry.item.handle.remote_request_id)

    def _fixable(self, err: BoomerangClientError) -> bool:
        if err.reason not in REREGISTER_REASONS:
            return False
        self.presence.reregister()
        return True

    def _accepted(self, entry: Entry[Registration], response: Any) -> None:
        if response.created:
            self.registered += 1
        else:
            self.duplicates += 1  # the gateway (or an earlier try) registered it first
