"""Token chains: how Boomerang proves a new prompt extends what a decode node holds.

A sequence of token ids is cut into blocks of `block_size` tokens. Whole block `i` gets

    h[i] = xxh3_128( h[i-1] ‖ le_u32(token) for each token of block i ),   h[-1] = SEED

so `h[i]` commits to every token of blocks 0..i. A trailing partial block of `r` tokens
(0 < r < block_size) gets

    tail = xxh3_128( h[last] ‖ b"tail" ‖ le_u32(r) ‖ le_u32(token) for each of its tokens )

Two sequences share exactly `k` leading whole blocks iff their first `k` hashes are equal,
and because each hash covers its whole prefix, equality is monotone: a binary search over
block positions finds the longest common prefix in O(log n) hash comparisons. The verified
prefix is that many whole blocks, plus the partial tail when both sequences are the same
length and their tails match (the sequences are then identical). It never exceeds the true
common token prefix.

A request's `cache_salt` (vLLM's isolation key) changes the seed, so chains of two salts
share no hash and never match, as vLLM's own prefix cache never hits across salts.

The hash is xxh3-128 (xxhash ≥ 0.8), 16 bytes per block, not a cryptographic hash: chains
compare sequences of one tenant's own conversation, never secrets. The same function runs
in Postgres (`boomerang_common_tokens`, migration 0001) so a claim is one SQL statement.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

HASH_BYTES = 16
SEED = b"boomerang.tokenchain.v1\x00\x00\x00\x00\x00\x00\x00\x00\x00"[:HASH_BYTES]
MAX_TOKEN_ID = 2**32 - 1
# The longest `cache_salt` PlanTurn and ReportTurn take as it is (see `salt_key`).
MAX_SALT = 256
_DIGEST_PREFIX = "sha256:"


@dataclass(frozen=True, slots=True)
class TokenChain:
    """The chained block hashes of one token sequence."""

    block_size: int
    num_tokens: int
    block_hashes: bytes  # whole blocks, HASH_BYTES each, concatenated
    tail_hash: bytes  # empty when num_tokens % block_size == 0

    @property
    def num_blocks(self) -> int:
        """Whole blocks in the chain."""
        return len(self.block_hashes) // HASH_BYTES

    def block_hash(self, index: int) -> bytes:
        """The chained hash of whole block `index`."""
        start = index * HASH_BYTES
        return self.block_hashes[start : start + HASH_BYTES]

    def validate(self) -> None:
        """Raise ValueError when the fields contradict each other."""
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be 1 to 1024, got {self.block_size}")
        if self.num_tokens < 0:
            raise ValueError(f"num_tokens must be non-negative, got {self.num_tokens}")
        if len(self.block_hashes) % HASH_BYTES:
            raise ValueError(f"block_hashes must be a multiple of {HASH_BYTES} bytes")
        expected = self.num_tokens // self.block_size
        if self.num_blocks != expected:
            raise ValueError(
                f"block_hashes holds {self.num_blocks} blocks but num_tokens={self.num_tokens}"
                f" with block_size={self.block_size} needs {expected}"
            )
        has_tail = self.num_tokens % self.block_size != 0
        if has_tail and len(self.tail_hash) != HASH_BYTES:
            raise ValueError(f"tail_hash must be {HASH_BYTES} bytes for a partial last block")
        if not has_tail and self.tail_hash:
            raise ValueError("tail_hash must be empty when num_tokens is a multiple of block_size")


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32s, as the chain hashes them (and the claim SQL reads them)."""
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error as exc:
        raise ValueError(f"token ids must be integers 0 to {MAX_TOKEN_ID}") from exc


def salt_key(salt: str) -> str:
    """A request's `cache_salt` as the control plane takes it: itself, or a SHA-256 digest of
    it when it is longer than MAX_SALT, holds control characters, or already looks like a digest.

    vLLM bounds neither, so such a salt is kept apart by its digest rather than refused or
    dropped (a dropped salt would let two salts share a lease). The digest is cryptographic,
    and a salt spelt like one is digested too, because the salt is an isolation key: nobody
    may send another salt's key as their own.
    """
    plain = len(salt) <= MAX_SALT and not salt.startswith(_DIGEST_PREFIX)
    if plain and not any(ord(ch) < 32 or ord(ch) == 127 for ch in salt):
        return salt
    return _DIGEST_PREFIX + hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()


def seed_for(salt: str) -> bytes:
    """The chain's seed: SEED, or one derived from a request's `cache_salt`."""
    return SEED if not salt else xxhash.xxh3_128_digest(SEED + b"salt" + salt.encode())


def build_chain(token_ids: Sequence[int], block_size: int, salt: str = "") -> TokenChain:
    """Hash `token_ids` into a chain of `block_size`-token blocks (seeded by `salt`, if any)."""
    if not 1 <= block_size <= 1024:
        raise ValueError(f"block_size must be 1 to 1024, got {block_size}")
    packed = pack_tokens(token_ids)
    stride = block_size * 4
    whole = len(token_ids) // block_size
    prev = seed_for(salt)
    out = bytearray()
    for i in range(whole):
        prev = xxhash.xxh3_128_digest(prev + packed[i * stride : (i + 1) * stride])
        out += prev
    tail = b""
    rest = len(token_ids) - whole * block_size
    if rest:
        tail = xxhash.xxh3_128_digest(
            prev + b"tail" + struct.pack("<I", rest) + packed[whole * stride :]
        )
    return TokenChain(block_size, len(token_ids), bytes(out), tail)


def common_blocks(a: TokenChain, b: TokenChain) -> int:
    """Leading whole blocks two chains share (binary search; chains must share block size)."""
    if a.block_size != b.block_size:
        raise ValueError("chains with different block sizes cannot be compared")
    lo, hi = 0, min(a.num_blocks, b.num_blocks)
    # Invariant: the first `lo` blocks match; none past `hi` can.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.block_hash(mid - 1) == b.block_hash(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_tokens(a: TokenChain, b: TokenChain) -> int:
    """Tokens of the verified common prefix: whole shared blocks, or all when identical."""
    blocks = common_blocks(a, b)
    if (
        a.num_tokens == b.num_tokens
        and blocks == a.num_blocks
        and a.tail_hash
        and a.tail_hash == b.tail_hash
    ):
        return a.num_tokens
    return blocks * a.block_size


# Finding the turn a prompt continues without a conversation id (design.md, "Finding the
# turn a prompt continues"). A lease whose previous prompt had `p` tokens is keyed by the
# chain hash of that prompt's last whole block (`p // block_size` blocks); a new prompt
# probes with every one of its whole-block hashes. The key proves the whole blocks; the
# prompt's partial last block (`p % block_size` tokens) is proved by `prompt_tail_digest`,
# which the claim statement recomputes from the new prompt's tokens (SHA-256, which
# Postgres has built in). Keys are the hash's first 8 bytes as a signed bigint: a smaller
# index, and a false match is harmless because the claim still verifies the chain.


def hash_key(block_hash: bytes) -> int:
    """A block hash's index key: its first 8 bytes as a signed big-endian integer."""
    return int.from_bytes(block_hash[:8], "big", signed=True)


def probe_keys(chain: TokenChain) -> list[int]:
    """The index keys of every whole block of a new prompt, block 1 first (position = blocks)."""
    n = chain.num_blocks
    return list(struct.unpack(f">{2 * n}q", chain.block_hashes)[::2]) if n else []


def prompt_key(chain: TokenChain, prompt_tokens: int) -> int | None:
    """The key a lease is found by: its previous prompt's last whole block; None below one block."""
    blocks = prompt_tokens // chain.block_size
    if blocks < 1 or blocks > chain.num_blocks:
        return None
    return hash_key(chain.block_hash(blocks - 1))


def prompt_tail_digest(chain: TokenChain, prompt_tokens: int, tail_ids: Sequence[int]) -> bytes:
    """SHA-256 of the prompt's partial last block, chained to its last whole block; b"" when none.

    The chained hash makes the digest of a few tokens unguessable without the prefix.
    """
    blocks = prompt_tokens // chain.block_size
    if not tail_ids or blocks < 1:
        return b""
    return hashlib.sha256(chain.block_hash(blocks - 1) + pack_tokens(tail_ids)).digest()
