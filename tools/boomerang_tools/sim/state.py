"""The simulator's configuration, counters and request records (plain data, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boomerang_tools.sim.costmodel import Link, Profile
from boomerang_tools.sim.kvstore import Allocation
from boomerang_tools.sim.nixl import Mode, RemoteHandle


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes one simulated engine."""

    role: str
    engine_id: str
    profile: Profile
    host: str = "127.0.0.1"
    side_channel_port: int = 0
    ttl_seconds: float = 480.0
    block_size: int = 16
    recompute_threshold: int = 64
    strip_reasoning: bool = False
    time_scale: float = 1.0
    expiry_margin_seconds: float = 5.0
    prefill_hold_seconds: float = 480.0
    num_gpu_blocks: int = 1_000_000
    clock_offset: float = 0.0
    served_model_name: str = ""
    max_model_len: int = 0
    tp_size: int = 1
    # vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens.
    enable_prompt_tokens_details: bool = False
    # vLLM's --enable-prefix-caching, with this many spare blocks to keep prefixes in; 0: off
    # (AWS's setting).
    prefix_cache_blocks: int = 0
    # The D→P link a pull goes over: the default (None: the profile's) and per remote engine id.
    link: Link | None = None
    links: tuple[tuple[str, Link], ...] = ()
    # A file every pull, load and retained turn is appended to as a JSON line; empty: none.
    ledger: str = ""


@dataclass
class Stats:
    """Counters reported by `GET /sim/stats` (pulls: this engine as P; loads: as D)."""

    requests: int = 0
    finished: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    computed_tokens: int = 0
    pulls: int = 0
    pulled_tokens: int = 0
    corrupt_pulls: int = 0
    expired_or_freed_reads: int = 0
    pull_failures: int = 0
    declined_expiring: int = 0
    recomputed_below_threshold: int = 0
    loads: int = 0
    loaded_tokens: int = 0
    corrupt_loads: int = 0
    expired_or_freed_loads: int = 0
    load_failures: int = 0
    reads_served: int = 0
    reads_refused: int = 0
    frees_requested: int = 0
    retained_turns: int = 0
    retention_skipped: int = 0
    held_turns: int = 0
    restarts: int = 0
    # vLLM's prefix-cache metrics, in tokens: prompt tokens looked up, and those that hit.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    tokenize_requests: int = 0  # POST /tokenize calls (a gateway that plans tokenizes every turn here)
    # Requests with no kv_transfer_params computed here (on a decode engine: a turn prefilled
    # on D over the history it holds), and the GPU time every prefill here took, unscaled ms.
    local_prefills: int = 0
    local_prefill_ms: float = 0.0
    # Decode steps made here, those a prefill on this engine paused, and the time it added.
    decode_steps: int = 0
    decode_stalled_steps: int = 0
    decode_stall_ms: float = 0.0


@dataclass(frozen=True)
class GenRequest:
    """A parsed generation request, in tokens."""

    prompt_ids: list[int]
    max_tokens: int
    eos: str
    reasoning: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    kv_transfer_params: Any = None


@dataclass
class Finish:
    """The end of a request."""

    reason: str
    kv_transfer_params: dict[str, Any] | None
    cached_tokens: int = 0  # prompt tokens not computed, as vLLM's usage reports them


@dataclass
class Token:
    """One generated token, its text, and on the last token the Finish."""

    id: int
    text: str
    finish: Finish | None = None


@dataclass
class Admission:
    """A request that has been accepted: its id, blocks and mode."""

    request_id: str
    req: GenRequest
    mode: Mode
    remote: RemoteHandle | None
    alloc: Allocation
    epoch: int
    started: float
    ran: bool = False  # set once Engine.run starts; otherwise Engine.discard releases it
