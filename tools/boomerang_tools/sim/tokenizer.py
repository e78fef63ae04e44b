"""The simulator's tokenizer: its own `tokenizer.json` (see `hfmodel`), run by the `tokenizers` library.

The same file is what a gateway loads for in-process tokenization (`BOOMERANG_TOKENIZERS`),
so the simulator's `/tokenize` and such a gateway agree by construction; ids are stable
across processes and machines. Text is cut into pieces that never span a newline or a
special token (`hfmodel.PIECE_PATTERN`), which keeps tokenization prefix-stable there.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from boomerang_tools.sim import hfmodel

TOKENIZER = Tokenizer.from_file(str(hfmodel.folder(False) / "tokenizer.json"))
SPECIAL_TOKENS: dict[str, int] = {s: TOKENIZER.token_to_id(s) or 0 for s in hfmodel.SPECIAL_TOKENS}
SPECIAL_BY_ID = {v: k for k, v in SPECIAL_TOKENS.items()}
# Tokens the detokenizer drops from text (skip_special_tokens); the tags stay, as in Qwen.
SKIPPED_IN_TEXT = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
VOCAB_SIZE = TOKENIZER.get_vocab_size(with_added_tokens=True)
IM_END = SPECIAL_TOKENS["<|im_end|>"]
END_OF_TEXT = SPECIAL_TOKENS["<|endoftext|>"]


@lru_cache(maxsize=4096)
def piece_id(piece: str) -> int:
    """The id of a piece that is one token (a special token, or one of the simulator's words)."""
    ids = TOKENIZER.encode(piece, add_special_tokens=False).ids
    if len(ids) != 1:
        raise ValueError(f"{piece!r} is {len(ids)} tokens of the simulator's tokenizer, not one")
    return int(ids[0])


def encode(text: str) -> list[int]:
    """Tokenize text (no BOS is added: Qwen has none)."""
    return list(TOKENIZER.encode(text, add_special_tokens=False).ids)
