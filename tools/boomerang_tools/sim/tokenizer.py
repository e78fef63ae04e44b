"""A deterministic, prefix-stable tokenizer standing in for Qwen's byte-level BPE.

Text is cut into pieces by one regular expression: the special tokens, each newline on its
own, a run of letters with at most one leading space (cut into chunks of at most
`MAX_WORD_CHARS` characters, as BPE splits long words), a digit, or one other character
with at most one leading space. A piece's id is `xxh3_64(piece) mod REGULAR_VOCAB`, stable
across processes and machines (never Python's salted `hash`); special tokens keep Qwen's ids.

Prefix stability is the property the simulator relies on: pieces never span a newline or a
special token, so the tokens of `a + b` are the tokens of `a` followed by those of `b`
whenever `a` ends in a newline or a special token. That is what lets a later turn's prompt
re-tokenize to exactly the earlier prompt plus the earlier output, as a real tokenizer does
for a well-behaved chat template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import xxhash

# Qwen2/Qwen3 special-token ids (tokenizer_config.json of Qwen/Qwen3-32B).
SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}
SPECIAL_BY_ID = {v: k for k, v in SPECIAL_TOKENS.items()}
# Tokens the detokenizer drops from text (skip_special_tokens); the tags stay, as in Qwen.
SKIPPED_IN_TEXT = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
REGULAR_VOCAB = 151643
VOCAB_SIZE = 151936
IM_END = SPECIAL_TOKENS["<|im_end|>"]
END_OF_TEXT = SPECIAL_TOKENS["<|endoftext|>"]
MAX_WORD_CHARS = 12

_SPECIAL_RE = "|".join(re.escape(s) for s in sorted(SPECIAL_TOKENS, key=len, reverse=True))
_PIECE = re.compile(_SPECIAL_RE + r"|\n| ?[^\W\d_]+|\d| ?[^\s\w]| ?_|[^\S\n]")


@dataclass(frozen=True)
class Encoding:
    """Token ids and the text piece each one came from."""

    ids: list[int]
    pieces: list[str]


def piece_id(piece: str) -> int:
    """The id of one piece: Qwen's id for a special token, else a stable hash."""
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    return xxhash.xxh3_64_intdigest(piece.encode("utf-8")) % REGULAR_VOCAB


def split(text: str) -> list[str]:
    """Cut text into pieces; joining them gives the text back."""
    pieces: list[str] = []
    for match in _PIECE.finditer(text):
        piece = match.group()
        if len(piece) > MAX_WORD_CHARS and piece not in SPECIAL_TOKENS:
            pieces.extend(piece[i : i + MAX_WORD_CHARS] for i in range(0, len(piece), MAX_WORD_CHARS))
        else:
            pieces.append(piece)
    return pieces


def encode(text: str) -> Encoding:
    """Tokenize text (no BOS is added: Qwen has none)."""
    pieces = split(text)
    return Encoding(ids=[piece_id(p) for p in pieces], pieces=pieces)


def decode_pieces(pieces: list[str]) -> str:
    """Detokenize with skip_special_tokens: drop control tokens, keep the text of the rest."""
    return "".join(p for p in pieces if p not in SKIPPED_IN_TEXT)
