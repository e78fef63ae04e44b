"""Simulated KV-cache memory: a block pool and the handles that pin blocks after a request.

A handle is what vLLM's NixlConnector keeps when `request_finished` returns
`delay_free=True`: the request's block ids plus — in the simulator — the token ids whose KV
those blocks hold, so a reader can check what it really got. Two kinds exist:

- `RETAINED` on a decode node (bidirectional transfer): all of a finished request's blocks,
  prompt plus output, kept for a prefill node to pull on the next turn, freed at the TTL
  (`decoder_kv_blocks_ttl`, counted on this engine's clock from the finish, never renewed)
  or after one read;
- `HELD` on a prefill node: the prompt's blocks, kept for the decode node to load, freed
  after one read or after `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (480 s).

Block ids come from a FIFO free queue, as in vLLM, so freed ids are reused by later
requests — a stale handle names blocks that now hold someone else's KV.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field


class Clock:
    """This engine's `time.perf_counter()`.

    perf_counter is CLOCK_MONOTONIC, which every process on one machine shares; real
    engines run on different machines whose monotonic clocks are unrelated. A fixed offset
    per engine restores that, so code that compares one engine's clock with another's
    without converting fails here as it would in production.
    """

    def __init__(self, offset: float):
        self.offset = offset

    def now(self) -> float:
        """Seconds on this engine's monotonic clock."""
        return time.perf_counter() + self.offset


class HandleKind(enum.Enum):
    """Why blocks outlive their request."""

    RETAINED = "retained"  # decode node, for a prefill node's pull next turn
    HELD = "held"  # prefill node, for the decode node's load this turn


class ReadError(Exception):
    """A read the engine holding the blocks cannot serve (on the reader's side: the blocks are
    gone); `reason` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PoolExhausted(Exception):
    """No free blocks."""


@dataclass
class Handle:
    """Blocks pinned after a request finished."""

    kind: HandleKind
    request_id: str
    block_ids: list[int]
    tokens: list[int]
    expires_at: float
    generation: int


@dataclass
class Allocation:
    """Blocks owned by an in-flight request."""

    block_ids: list[int]
    live: bool = True


@dataclass
class KVStore:
    """The block pool and the live handles of one engine."""

    num_blocks: int
    block_size: int
    clock: Clock
    free: deque[int] = field(default_factory=deque)
    handles: dict[str, Handle] = field(default_factory=dict)
    expired: int = 0
    # Decode memory held for pulls (RETAINED handles): now, at most, and integrated over time.
    retained_now: int = 0
    retained_peak: int = 0
    block_seconds: float = 0.0
    _metered_at: float | None = None

    def __post_init__(self) -> None:
        self.free.extend(range(self.num_blocks))

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed for `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    @property
    def used_blocks(self) -> int:
        """Blocks not in the free queue (in-flight requests and handles)."""
        return self.num_blocks - len(self.free)

    def allocate(self, num_tokens: int) -> Allocation:
        """Blocks for a new request, or PoolExhausted."""
        self.sweep()
        need = self.blocks_for(num_tokens)
        if need > len(self.free):
            raise PoolExhausted(f"KV cache full: {need} blocks needed, {len(self.free)} free")
        return Allocation([self.free.popleft() for _ in range(need)])

    def release(self, alloc: Allocation) -> None:
        """Return an in-flight request's blocks (abort, or no retention)."""
        if alloc.live:
            self.free.extend(alloc.block_ids)
            alloc.live = False

    def meter(self) -> None:
        """Add the retained blocks' block-seconds since the last change (called before each)."""
        now = self.clock.now()
        if self._metered_at is not None:
            self.block_seconds += self.retained_now * max(0.0, now - self._metered_at)
        self._metered_at = now

    def _held(self, handle: Handle, sign: int) -> None:
        if handle.kind is HandleKind.RETAINED:
            self.retained_now += sign * len(handle.block_ids)
            self.retained_peak = max(self.retained_peak, self.retained_now)

    def pin(self, kind: HandleKind, request_id: str, alloc: Allocation, tokens: list[int], ttl: float, generation: int) -> Handle:
        """Keep the blocks covering `tokens` under a handle; release the rest."""
        self.meter()
        keep = self.blocks_for(len(tokens))
        ids, rest = alloc.block_ids[:keep], alloc.block_ids[keep:]
        self.free.extend(rest)
        alloc.live = False
        old = self.handles.pop(request_id, None)
        if old is not None:  # a reused request id: the newer request wins
            self.free.extend(old.block_ids)
            self._held(old, -1)
        handle = Handle(kind, request_id, ids, list(tokens), self.clock.now() + ttl, generation)
        self.handles[request_id] = handle
        self._held(handle, +1)
        return handle

    def read(self, request_id: str, block_ids: list[int], num_tokens: int, generation: int | None) -> list[int]:
        """Serve one read: the token contents of `block_ids`, first `num_tokens`; then free.

        A handle is good for exactly one read, as vLLM frees the blocks once the reader
        notifies it.
        """
        self.sweep()
        handle = self.handles.get(request_id)
        if handle is None:
            raise ReadError("FREED", f"no blocks held for request {request_id!r} (freed, expired or never held)")
        if generation is not None and generation != handle.generation:
            raise ReadError("STALE_GENERATION", f"handle is generation {handle.generation}, read asked for {generation}")
        position = {b: i for i, b in enumerate(handle.block_ids)}
        if not block_ids or any(b not in position for b in block_ids):
            raise ReadError("UNKNOWN_BLOCKS", f"block ids are not all held for request {request_id!r}")
        tokens: list[int] = []
        for b in block_ids:
            i = position[b] * self.block_size
            tokens.extend(handle.tokens[i : i + self.block_size])
        self._drop(request_id)
        return tokens[: max(0, num_tokens)]

    def drop(self, request_id: str) -> bool:
        """Free a handle without reading it (a reader that recomputed instead)."""
        self.sweep()
        return self._drop(request_id)

    def _drop(self, request_id: str) -> bool:
        handle = self.handles.get(request_id)
        if handle is None:
            return False
        self.meter()
        del self.handles[request_id]
        self._held(handle, -1)
        self.free.extend(handle.block_ids)
        return True

    def sweep(self) -> int:
        """Free every handle whose deadline has passed; returns how many. (Each is metered
        as held until now: vLLM frees an expired handle at its next step, not at the deadline.)"""
        now = self.clock.now()
        due = [rid for rid, h in self.handles.items() if h.expires_at <= now]
        for rid in due:
            self._drop(rid)
        self.expired += len(due)
        return len(due)

    def drop_all(self) -> int:
        """Free every handle (engine restart); returns how many."""
        count = len(self.handles)
        for rid in list(self.handles):
            self._drop(rid)
        return count

    def pinned_blocks(self, kind: HandleKind) -> int:
        """Blocks held by live handles of one kind."""
        self.sweep()
        return sum(len(h.block_ids) for h in self.handles.values() if h.kind is kind)
