"""The synthetic workload, deterministic so every process derives the same conversations.

Conversation `k` belongs to tenant `k mod tenants`, retains `num_tokens` tokens (its last
turn's prompt plus output) on decode engine `k mod engines`, and those tokens are a slice
of one shared pseudo-random token pool; its next prompt is that slice plus `NEW_TOKENS`
tokens of a new user message. Preloader and load generators compute the same slices, so
the registry's chain comparison really verifies the prefix (a plan PULLs the lease).

Only *planned* conversations (even `k`) get real xxh3 token chains at preload; the others
fill the table to the wanted size with chains of the right length cut from random bytes,
which Postgres stores exactly alike (hashes are incompressible either way).
"""

from __future__ import annotations

import functools
import random
from array import array
from dataclasses import dataclass

from boomerang.tokenchain import HASH_BYTES, TokenChain, build_chain, prompt_key, prompt_tail_digest

SEED = 20261129
POOL_TOKENS = 1 << 20
VOCAB = 151_643  # Qwen3's vocabulary
MIN_TOKENS, MAX_TOKENS = 256, 2304  # tokens a retained turn holds (uniform)
NEW_TOKENS = 96  # the next user message
PREV_OUTPUT = 40  # of a retained turn's tokens, the answer; the rest was its prompt
BLOCK_SIZE = 16
MODEL = "bench/qwen3-32b"


@functools.cache
def token_pool() -> array:  # type: ignore[type-arg]
    """2**20 token ids, the same in every process."""
    raw = array("I")
    raw.frombytes(random.Random(SEED).randbytes(4 * POOL_TOKENS))
    return array("I", (t % VOCAB for t in raw))


@functools.cache
def random_bytes() -> bytes:
    """Random bytes to cut filler chains from."""
    return random.Random(SEED + 1).randbytes(1 << 20)


@dataclass(frozen=True, slots=True)
class Conversation:
    """One conversation's retained turn."""

    index: int
    tenant: str
    conversation_id: str
    engine: int  # decode engine index
    offset: int  # into the token pool
    num_tokens: int

    @property
    def planned(self) -> bool:
        """Whether load generators plan turns of it (it has a real chain)."""
        return self.index % 2 == 0

    @property
    def num_blocks(self) -> int:
        """KV blocks D holds for it (the partial last block counts)."""
        return -(-self.num_tokens // BLOCK_SIZE)


def conversation(k: int, tenants: int, engines: int) -> Conversation:
    """Conversation number `k` of the layout."""
    h = (k * 2654435761 + 97) & 0xFFFFFFFF
    num_tokens = MIN_TOKENS + h % (MAX_TOKENS - MIN_TOKENS)
    offset = (h * 40503 + k) % (POOL_TOKENS - MAX_TOKENS - NEW_TOKENS)
    return Conversation(k, f"bench-t{k % tenants:04d}", f"conv-{k:08d}", k % engines, offset, num_tokens)


def retained_tokens(c: Conversation) -> list[int]:
    """The tokens D retained (the previous turn's prompt and output)."""
    return token_pool()[c.offset : c.offset + c.num_tokens].tolist()


def next_prompt(c: Conversation) -> list[int]:
    """The next turn's prompt: the retained tokens plus a new user message."""
    pool = token_pool()
    new_at = (c.offset * 7 + 13) % (POOL_TOKENS - NEW_TOKENS)
    return retained_tokens(c) + pool[new_at : new_at + NEW_TOKENS].tolist()


def chain_for(c: Conversation) -> TokenChain:
    """The lease's token chain: real for planned conversations, filler otherwise."""
    if c.planned:
        return build_chain(retained_tokens(c), BLOCK_SIZE)
    noise = random_bytes()
    whole = c.num_tokens // BLOCK_SIZE
    start = (c.index * 4099) % (len(noise) - (whole + 1) * HASH_BYTES)
    tail = noise[start + whole * HASH_BYTES : start + (whole + 1) * HASH_BYTES] if c.num_tokens % BLOCK_SIZE else b""
    return TokenChain(BLOCK_SIZE, c.num_tokens, noise[start : start + whole * HASH_BYTES], tail)


def planned_indices(start: int, stop: int) -> list[int]:
    """The planned conversations among `start … stop-1`."""
    return list(range(start + start % 2, stop, 2))


def prompt_end(c: Conversation, chain: TokenChain) -> tuple[int, int | None, bytes]:
    """Where the retained turn's prompt ended, as a registration records it: (prompt tokens,
    key, tail digest); for fillers, from their random chains (the index holds them alike)."""
    prompt = c.num_tokens - PREV_OUTPUT
    tail = prompt % BLOCK_SIZE
    tokens = token_pool()[c.offset + prompt - tail : c.offset + prompt].tolist()
    return prompt, prompt_key(chain, prompt), prompt_tail_digest(chain, prompt, tokens)
