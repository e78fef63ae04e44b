"""An engine's own prefix cache (vLLM's automatic prefix caching), with a finite capacity.

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

from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash


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
