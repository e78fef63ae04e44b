"""Simulated KV-cache memory: a block pool, the handles that pin blocks after a request, and
the engine's own prefix cache.

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

The prefix cache (`PrefixCache`) is vLLM's automatic prefix caching, with a finite capacity.
vLLM keys each *full* block of a prompt by a hash chained over every token before it, so a
block hits only when the whole prefix up to its end is the same. The cache is the engine's
free block pool: a finished request's blocks stay readable under their hashes until the
pool hands them out again, and it hands out the least recently used first (free blocks are
appended to the tail of the free queue, tail block of a request first, and allocation pops
from the head: `block_pool.free_blocks`, `get_new_blocks`). So when many conversations share
one engine, each new prompt evicts the oldest blocks of the others, and a conversation's
blocks go from its end backwards, keeping the head usable the longest.

Here the pool's spare capacity is a number of blocks (`capacity_blocks`, from
`--prefix-cache-blocks`), separate from the blocks in-flight requests and held handles
use. Each cached block keeps the token ids whose KV it really holds: KV that arrived
corrupt is cached under the prompt's hash, as on real hardware, and poisons later hits.
"""

from __future__ import annotations

import enum
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import xxhash


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


@dataclass(frozen=True)
class Hit:
    """A lookup: the cached prefix length (tokens, whole blocks) and the KV it holds."""

    tokens: int
    kv: list[int]


class PrefixCache:
    """Full blocks keyed by their chained hash, evicted least recently used first."""

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 0 or block_size < 1:
            raise ValueError("capacity_blocks must be >= 0 and block_size >= 1")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.blocks: OrderedDict[bytes, list[int]] = OrderedDict()  # least recently used first
        self.evicted_blocks = 0

    @property
    def enabled(self) -> bool:
        """Whether the engine caches prefixes at all (capacity 0: off, as in AWS's tests)."""
        return self.capacity_blocks > 0

    def _hashes(self, tokens: list[int], limit: int) -> Iterator[bytes]:
        """The chained hashes of the first `limit` full blocks of `tokens`, one at a time (a
        lookup stops hashing at its first miss)."""
        parent, bs = b"", self.block_size
        for i in range(min(limit, len(tokens) // bs)):
            parent = xxhash.xxh3_128_digest(parent + array("I", tokens[i * bs : (i + 1) * bs]).tobytes())
            yield parent

    def lookup(self, prompt: list[int]) -> Hit:
        """The longest cached prefix of `prompt`, in whole blocks, leaving at least the last
        prompt token to compute (vLLM's `max_cache_hit_length = num_tokens - 1`)."""
        if not self.enabled or not prompt:
            return Hit(0, [])
        kv: list[int] = []
        for key in self._hashes(prompt, (len(prompt) - 1) // self.block_size):
            block = self.blocks.get(key)
            if block is None:
                break
            kv.extend(block)
        return Hit(len(kv), kv)

    def keys(self, prompt: list[int]) -> list[bytes]:
        """The chained hashes of every full block of `prompt` (none when the cache is off): an
        engine computes them while its modelled step runs, and inserts at the step's end."""
        return list(self._hashes(prompt, len(prompt) // self.block_size)) if self.enabled else []

    def insert(self, prompt: list[int], kv: list[int], keys: list[bytes] | None = None) -> None:
        """Cache the full blocks of a computed prompt (`kv`: what its KV really holds) as the
        most recently used, tail block first, then evict down to capacity. `keys`: the
        prompt's `keys()`, if already computed."""
        if not self.enabled:
            return
        bs = self.block_size
        keys = self.keys(prompt) if keys is None else keys
        for i in reversed(range(len(keys))):
            self.blocks[keys[i]] = list(kv[i * bs : (i + 1) * bs])
            self.blocks.move_to_end(keys[i])
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
            self.evicted_blocks += 1
