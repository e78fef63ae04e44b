"""Token chains: the verified prefix never exceeds the true common prefix."""

from __future__ import annotations

import pytest
from boomerang.tokenchain import HASH_BYTES, TokenChain, build_chain, common_blocks, common_tokens
from hypothesis import given, settings
from hypothesis import strategies as st

tokens = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300)
small_tokens = st.lists(st.integers(min_value=0, max_value=5), max_size=200)
block_sizes = st.sampled_from([1, 2, 3, 4, 7, 16, 32])


def true_common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@given(a=small_tokens, b=small_tokens, bs=block_sizes)
@settings(max_examples=400)
def test_verified_prefix_is_true_prefix_floored_to_blocks(a: list[int], b: list[int], bs: int) -> None:
    ca, cb = build_chain(a, bs), build_chain(b, bs)
    verified = common_tokens(ca, cb)
    true = true_common(a, b)
    assert verified <= true
    if a == b:
        assert verified == len(a)
    else:
        assert verified == (true // bs) * bs


@given(prefix=tokens, a_rest=small_tokens, b_rest=small_tokens, bs=block_sizes)
@settings(max_examples=200)
def test_shared_prefix_is_found_whatever_follows(prefix: list[int], a_rest: list[int], b_rest: list[int], bs: int) -> None:
    a, b = prefix + a_rest, prefix + b_rest
    verified = common_tokens(build_chain(a, bs), build_chain(b, bs))
    assert verified >= (len(prefix) // bs) * bs
    assert verified <= true_common(a, b)


@given(seq=tokens, bs=block_sizes)
def test_chain_shape(seq: list[int], bs: int) -> None:
    chain = build_chain(seq, bs)
    chain.validate()
    assert chain.num_blocks == len(seq) // bs
    assert len(chain.tail_hash) == (HASH_BYTES if len(seq) % bs else 0)


def test_single_token_edit_in_the_middle_cuts_the_prefix_there() -> None:
    seq = list(range(1000))
    edited = seq.copy()
    edited[500] = 99999
    assert common_tokens(build_chain(seq, 16), build_chain(edited, 16)) == 496
    assert common_blocks(build_chain(seq, 16), build_chain(edited, 16)) == 31


def test_chains_are_stable_across_runs() -> None:
    # Pinned digest: the chain format is a contract with the Postgres function and stored leases.
    chain = build_chain([1, 2, 3, 4, 5], 4)
    assert chain.block_hashes.hex() == build_chain([1, 2, 3, 4, 9], 4).block_hashes.hex()
    assert chain.tail_hash != build_chain([1, 2, 3, 4, 9], 4).tail_hash
    assert len(chain.block_hashes) == 16


def test_partial_tail_length_is_part_of_the_hash() -> None:
    a = build_chain([7, 7, 7], 4)
    b = build_chain([7, 7, 7, 7, 7, 7, 7], 4)
    assert common_tokens(a, b) == 0  # no whole block in common; tails never match across lengths


@pytest.mark.parametrize(
    "chain, message",
    [
        (TokenChain(0, 0, b"", b""), "block_size"),
        (TokenChain(4, 8, b"x" * 16, b""), "needs 2"),
        (TokenChain(4, 5, b"x" * 16, b""), "tail_hash"),
        (TokenChain(4, 4, b"x" * 16, b"y" * 16), "must be empty"),
        (TokenChain(4, 4, b"x" * 15, b""), "multiple"),
    ],
)
def test_validate_rejects_inconsistent_chains(chain: TokenChain, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chain.validate()


def test_rejects_out_of_range_tokens() -> None:
    with pytest.raises(ValueError, match="token ids"):
        build_chain([-1], 4)
    with pytest.raises(ValueError, match="block_size"):
        build_chain([1], 0)


def test_salt_key_keeps_plain_salts_and_digests_the_rest_unforgeably() -> None:
    from boomerang.tokenchain import MAX_SALT, salt_key

    assert salt_key("") == "" and salt_key("acme") == "acme" and salt_key("x" * MAX_SALT) == "x" * MAX_SALT
    long_a, long_b = "a" * (MAX_SALT + 1), "a" * MAX_SALT + "b"
    assert salt_key(long_a) != salt_key(long_b)  # never truncated into one another
    assert len(salt_key(long_a)) <= MAX_SALT
    assert salt_key("tab\there") != "tab\there" and salt_key("tab\there").startswith("sha256:")
    # Sending another salt's digest as one's own salt does not give its key.
    assert salt_key(salt_key(long_a)) != salt_key(long_a)
