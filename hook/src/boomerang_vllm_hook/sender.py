"""The decode side's background sender: retained turns to the registry, off the scheduler thread.

`submit` is all the scheduler thread does (a deque append under a lock). One daemon thread
(`outbox.OutboxWorker`) keeps the engine registered and heartbeating (`EnginePresence`) and
drains the queue in batches: it builds each turn's token chain and sends up to `batch_size`
of them as one RegisterRetainedBlocksBatch call (the registry group-commits them). An
answer that the registry no longer knows this engine at this generation registers it, then
retries; a registration refused otherwise (a stale generation, a bad request, another
conversation's request id) is dropped and counted by reason.

Retries are safe because a registration is idempotent on (engine id, generation,
remote_request_id) in the registry, and its `request_id` is derived from the same triple.
A turn is abandoned only at its deadline: D's own expiry of the blocks (its
`remote_blocks_expiry_time`), after which a lease would be useless anyway.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_vllm_hook.outbox import Entry, OutboxWorker
from boomerang_vllm_hook.presence import (
    REREGISTER_REASONS,
    EngineFacts,
    EnginePresence,
    Load,
    Memory,
    OnReleased,
)
from boomerang_vllm_hook.requestview import RetainedHandle, TurnContext

log = logging.getLogger(__name__)

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
