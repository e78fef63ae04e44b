"""The token chain's keys for finding, without a conversation id, the turn a prompt continues."""

from __future__ import annotations

import hashlib

from boomerang.tokenchain import (
    build_chain,
    common_blocks,
    hash_key,
    pack_tokens,
    probe_keys,
    prompt_key,
    prompt_tail_digest,
)


def test_a_salt_changes_every_hash_and_two_salts_never_match() -> None:
    tokens = list(range(100))
    plain, a, b = build_chain(tokens, 16), build_chain(tokens, 16, "a"), build_chain(tokens, 16, "b")
    assert common_blocks(plain, a) == 0 and common_blocks(a, b) == 0
    assert build_chain(tokens, 16, "a") == a


def test_a_lease_key_is_the_probe_key_at_its_prompts_whole_blocks() -> None:
    prompt = list(range(1000, 1037))  # 2 whole blocks and 5 tokens
    lease = build_chain(prompt + [7] * 20, 16)
    new = build_chain(prompt + [7] * 20 + [9] * 30, 16)
    keys = probe_keys(new)
    assert len(keys) == new.num_blocks
    assert prompt_key(lease, len(prompt)) == keys[1] == hash_key(new.block_hash(1))
    assert prompt_key(lease, 15) is None  # below one block: not found without an id


def test_the_tail_digest_is_sha256_of_the_last_whole_hash_and_the_tail_tokens() -> None:
    prompt = list(range(37))
    chain = build_chain(prompt + [1, 2, 3], 16)
    digest = prompt_tail_digest(chain, 37, prompt[32:])
    assert digest == hashlib.sha256(chain.block_hash(1) + pack_tokens(prompt[32:])).digest()
    assert prompt_tail_digest(chain, 32, []) == b""
