"""Deterministic "model output": a function of the context tokens only.

The output is drawn from a fixed word list with a PRNG seeded by `xxh3_64` of the context
token ids, so the same prompt always yields the same reply (multi-turn histories are
reproducible across processes), and a different context — including KV pulled from the
wrong sequence — yields a different reply, as a real model's would. Every word is a single
token of `boomerang_tools.sim.tokenizer`, so re-tokenizing the reply gives back the same ids.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import xxhash

from boomerang_tools.sim import hfmodel
from boomerang_tools.sim.tokenizer import piece_id

WORDS = hfmodel.GENERATED_WORDS
PUNCT = [",", ".", ";"]
MIN_ANSWER, MAX_ANSWER = 12, 48
MIN_REASONING, MAX_REASONING = 8, 24


@dataclass(frozen=True)
class Piece:
    """One generated token: its id and its text piece."""

    id: int
    text: str


def seed_of(tokens: list[int]) -> int:
    """A stable 64-bit seed from token ids."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens))


def _sentence(rng: random.Random, n: int) -> Iterator[str]:
    for i in range(n):
        word = rng.choice(WORDS)
        if i == 0:
            yield word.capitalize()
        elif i == n - 1:
            yield "."
        elif rng.random() < 0.08:
            yield rng.choice(PUNCT[:1])
        else:
            yield " " + word


def _pieces(texts: Iterable[str]) -> Iterator[Piece]:
    return (Piece(piece_id(t), t) for t in texts)


def generate(context: list[int], eos: str, reasoning: bool = False) -> Iterator[Piece]:
    """An endless stream of pieces for `context`.

    The natural reply (optional `<think>` block, an answer of 12–48 tokens, then `eos`)
    comes first; after it, for `ignore_eos` requests, more sentences without end.
    """
    rng = random.Random(seed_of(context))
    if reasoning:
        yield from _pieces(("<think>", "\n"))
        yield from _pieces(_sentence(rng, rng.randint(MIN_REASONING, MAX_REASONING)))
        yield from _pieces(("\n", "</think>", "\n", "\n"))
    yield from _pieces(_sentence(rng, rng.randint(MIN_ANSWER, MAX_ANSWER)))
    yield from _pieces((eos,))
    while True:
        sentence = _sentence(rng, rng.randint(MIN_ANSWER, MAX_ANSWER))
        yield from _pieces(" " + p if p[0].isalpha() else p for p in sentence)
