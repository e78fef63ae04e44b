"""Prefill and copy times measured on one NVIDIA H200: the figures the `*-h200` profiles are fit to.

Where they come from: one H200 (141 GB), torch 2.11 (CUDA 13), transformers 5.17, batch 1,
TP=1, bf16, random weights in the exact shape of Qwen3-32B and of Qwen3-8B (only the time
matters), measured 2026-12-04 with CUDA events, the median of 2–3 runs after a warm-up. For a
context of `context` tokens whose last `suffix` tokens are the new turn:

- `full_ms`: one prefill of all `context` tokens (what P does when nothing is reused);
- `suffix_ms`: one prefill of the last `suffix` tokens over a KV cache holding the first
  `context − suffix`, its attention done as vLLM does it (causal to the lower right, native
  grouped KV heads) — what P does after a pull;
- `kv_bytes`: the KV bytes of the `context − suffix` reused tokens (Qwen3-32B: 262,144 bytes a
  token, 64 layers × 8 KV heads × 128 dims × K and V × 2 bytes; Qwen3-8B: 147,456, 36 layers);
- `copy_ms`: one pinned host→device copy of those bytes, 55 GB/s: a stand-in for a PCIe Gen5
  or 400 Gb/s RDMA link between engines;
- `decode_ms`: one decode step over the full context (transformers' eager path; vLLM's CUDA
  graphs are faster), measured for Qwen3-32B with a 128-token suffix only.

The Qwen3-32B suffix at 2,000 tokens varied most between runs (53–73 ms). docs/performance.md
has the table these rows make and what it says for Boomerang.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class H200Point:
    """One measured context of one model shape (milliseconds, bytes)."""

    shape: str
    suffix: int
    context: int
    full_ms: float
    suffix_ms: float
    kv_bytes: int
    copy_ms: float
    decode_ms: float | None

    @property
    def reused(self) -> int:
        """Tokens whose KV a pull moves (the context before the new turn)."""
        return self.context - self.suffix

    @property
    def pulled_turn_ms(self) -> float:
        """P's side of a pulled turn: the copy, then the new turn's prefill."""
        return self.suffix_ms + self.copy_ms

    @property
    def ceiling(self) -> float:
        """Recompute over the pulled turn (P's side only)."""
        return self.full_ms / self.pulled_turn_ms


POINTS: tuple[H200Point, ...] = (
    H200Point("qwen3-32b", 128, 2000, 251.8, 67.0, 490733568, 8.88, 43.0),
    H200Point("qwen3-32b", 128, 8000, 1086.0, 48.5, 2063597568, 37.22, 43.0),
    H200Point("qwen3-32b", 128, 16000, 2402.8, 60.9, 4160749568, 74.95, 43.2),
    H200Point("qwen3-32b", 128, 24000, 3859.9, 73.8, 6257901568, 112.95, 67.3),
    H200Point("qwen3-32b", 1024, 2000, 249.4, 140.9, 255852544, 4.64, None),
    H200Point("qwen3-32b", 1024, 8000, 1086.4, 183.4, 1828716544, 33.05, None),
    H200Point("qwen3-32b", 1024, 24000, 3858.5, 289.0, 6023020544, 110.24, None),
    H200Point("qwen3-8b", 128, 2000, 66.3, 26.5, 276037632, 5.03, None),
    H200Point("qwen3-8b", 128, 8000, 274.6, 28.7, 1160773632, 20.93, None),
    H200Point("qwen3-8b", 128, 16000, 621.6, 27.4, 2340421632, 42.19, None),
    H200Point("qwen3-8b", 128, 24000, 1009.2, 30.0, 3520069632, 63.44, None),
)


def points(shape: str, suffix: int | None = None) -> list[H200Point]:
    """The measured points of one model shape (of one suffix length, if given)."""
    return [p for p in POINTS if p.shape == shape and (suffix is None or p.suffix == suffix)]
