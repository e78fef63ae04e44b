"""The decode side's background sender: retained turns to the registry, off the scheduler thread.

`submit` is all the scheduler thread does (a deque append under a lock). One daemon thread
keeps the engine registered and heartbeating (`EnginePresence`) and drains the queue in
batches: it builds each turn's token chain, sends up to `batch_size` of them as one
RegisterRetainedBlocksBatch call (in calls of at most 256, the registry's limit; the registry
group-commits them), and sorts the answers, which come one per registration:

* acknowledged (new, or a repeat of a registration that already landed) — done;
* transient (UNAVAILABLE, DEADLINE_EXCEEDED, …) — back to the front of the queue, then a
  growing pause (50 ms to 2 s) before the next try, until the turn's deadline;
* the registry no longer knows this engine at this generation — register it, then retry;
* anything else (a stale generation, a bad request, another conversation's request id) —
  dropped and counted by reason: retrying cannot help.

Retries are safe because a registration is idempotent on (engine id, generation,
remote_request_id) in the registry, and its `request_id` is derived from the same triple.
A turn is abandoned only at its deadline: D's own expiry of the blocks (its
`remote_blocks_expiry_time`), after which a lease would be useless anyway. A batch the
registry refuses whole gives each of its registrations that error as its answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient
from boomerang.resilience import TRANSIENT_CODES, Backoff
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_vllm_hook.batching import BatchedRpc, BatchedSender
from boomerang_vllm_hook.outbox import Entry, Outbox, OutboxWorker
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
        super().__init__(f"boomerang-sender-{facts.engine_id}")
        self.client = client
        self.facts = facts
        self.batch_size = batch_size
        self.rpc_timeout = rpc_timeout
        # perf_counter: the clock of D's `remote_blocks_expiry_time`, which sets the deadlines.
        self.clock = clock
        self.outbox: Outbox[Registration] = Outbox(queue_size, when_full, clock)
        self.presence = EnginePresence(
            client, facts, rpc_timeout=rpc_timeout, heartbeat_interval=heartbeat_interval, load=load, clock=clock,
            memory=memory, on_released=on_released,
        )
        self.registered = 0
        self.duplicates = 0
        self.stale = 0
        self.rejected: Counter[str] = Counter()
        self.transient_failures = 0
        self.calls: BatchedSender[Entry[Registration]] = BatchedSender(BatchedRpc(
            "RegisterRetainedBlocksBatch",
            lambda chunk: client.register_retained_blocks_batch_future(
                rpb.RegisterRetainedBlocksBatchRequest(registrations=[e.prepared for e in chunk]), timeout=rpc_timeout),
        ))

    # -- the scheduler thread's side -----------------------------------------------------

    def submit(self, registration: Registration, deadline: float) -> bool:
        """Queue a retained turn until `deadline` (on `clock`); never blocks."""
        return self.outbox.offer(registration, deadline)

    def snapshot(self) -> dict[str, Any]:
        """Counters for logs and tests."""
        s = self.outbox.stats
        return {
            "queued": len(self.outbox),
            "offered": s.offered,
            "registered": self.registered,
            "duplicates": self.duplicates,
            "stale": self.stale,
            "rejected": dict(self.rejected),
            "transient_failures": self.transient_failures,
            "batch_calls": self.calls.batch_calls,
            "retried": s.retried,
            "expired": s.expired,
            "dropped_full": s.dropped_full,
            "rejected_full": s.rejected_full,
            "engine_registrations": self.presence.registrations,
            "heartbeats": self.presence.heartbeats,
            "releases_taken": self.presence.released,
            "engine_registered": self.presence.registered,
            "generation": self.presence.generation,
        }

    # -- the background thread -----------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                if not self.presence.tick():
                    if self.presence.superseded:
                        self._drain_superseded()
                    self._stop.wait(0.02)
                    continue
                wait = min(self.presence.seconds_to_heartbeat(), 0.5)
                batch = self.outbox.take(self.batch_size, timeout=wait)
                if not batch:
                    continue
                try:
                    clean = self._send(batch)
                finally:
                    self.outbox.done(len(batch))  # after any retry put its entries back
                if clean:
                    backoff.reset()
                else:
                    self._stop.wait(backoff.next())
            except Exception:  # the thread must outlive any bug in one round
                log.exception("boomerang: sender round failed")
                self._stop.wait(backoff.next())

    def _drain_superseded(self) -> None:
        dropped = self.outbox.take(self.batch_size, timeout=0)
        if dropped:
            self.rejected["ENGINE_SUPERSEDED"] += len(dropped)
            self.outbox.done(len(dropped))  # taken only to be dropped: nothing left for flush to wait on

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

    def _send(self, batch: list[Entry[Registration]]) -> bool:
        """One round; True when nothing failed transiently."""
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
            return True
        answers = self.calls.send(ready)
        again: list[Entry[Registration]] = []
        transient = False
        for entry, resp in answers:
            if isinstance(resp, BoomerangClientError):
                err = resp
                if err.code in TRANSIENT_CODES:
                    transient = True
                    self.transient_failures += 1
                    again.append(entry)
                elif err.reason in REREGISTER_REASONS:
                    self.presence.reregister()
                    again.append(entry)
                else:
                    self.rejected[err.reason] += 1
                    log.warning("boomerang: registry refused %s: %s", entry.prepared.remote_request_id, err)
                continue
            if resp.created:
                self.registered += 1
            else:
                self.duplicates += 1  # the gateway (or an earlier try) registered it first
        if again:
            self.outbox.retry(again)
        return not transient
