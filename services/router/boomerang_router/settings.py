"""Settings of the router service (`boomerang router`), from `BOOMERANG_*` variables and flags."""

from __future__ import annotations

from typing import Annotated

from boomerang_server.config import EnginePoolSettings, Flag, Listen, check_listen
from boomerang_server.enginepool import StaticEngines
from pydantic import Field, field_validator


class RouterSettings(EnginePoolSettings):
    """Settings of the router service (`boomerang router`)."""

    listen: Listen = Field(
        default="127.0.0.1:50052", description="gRPC listen address (port 0: a free one)."
    )
    claim_deadline_ms: float = Field(
        default=50.0,
        gt=0,
        le=60_000,
        description="Milliseconds a plan waits for the registry's claim before answering "
        "CONTROL_PLANE_DEGRADED (longer for long prompts: claim_wait_share).",
    )
    claim_wait_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="A claim may also wait this share of the prefill time its prompt could save "
        "(prompt tokens × BOOMERANG_PREFILL_MS_PER_TOKEN, at most 1 s) when that is longer than "
        "claim_deadline_ms; always within the caller's deadline. 0: claim_deadline_ms alone.",
    )
    claim_batch_max: int = Field(
        default=64,
        ge=1,
        le=256,
        description="Most claims sent to the registry in one ClaimReuseBatch; 1: every claim its own ClaimReuse.",
    )
    claim_batches_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Claim calls on the wire at once; claims that arrive meanwhile queue and leave together.",
    )
    claim_queue_max: int = Field(
        default=4096,
        ge=1,
        description="Claims waiting for the registry at most; beyond it a plan answers "
        "CONTROL_PLANE_DEGRADED at once.",
    )
    min_remaining_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=3600,
        description="Seconds a lease must still live when claimed, so the pull ends well "
        "before the registry's deadline (itself before the decode node's TTL).",
    )
    block_size: int = Field(
        default=16, ge=1, le=1024, description="Tokens per KV block when engines do not say."
    )
    kv_recompute_threshold: int = Field(
        default=64,
        ge=0,
        le=1_000_000,
        description="Fewest reusable tokens worth a pull when the prefill engine does not say.",
    )
    ttft_prefill_floor_ms: float = Field(
        default=49.8,
        ge=0,
        le=600_000,
        description="Predicted prefill time, the least milliseconds a prefill takes (one forward pass): "
        "the prior every engine's learned prefill cost starts from (as measured for Qwen3-32B on one "
        "H200, TP 1).",
    )
    ttft_prefill_token_ms: float = Field(
        default=0.1253,
        ge=0,
        le=1000,
        description="Predicted prefill time, milliseconds per computed token when the tokens, not the "
        "floor, bound it (prior: Qwen3-32B on one H200).",
    )
    ttft_prefill_attention_ms: float = Field(
        default=0.00294,
        ge=0,
        le=1000,
        description="Predicted prefill time, milliseconds per computed token per 1,000 computed tokens, "
        "halved: their attention among themselves (prior: Qwen3-32B on one H200).",
    )
    ttft_prefill_context_ms: float = Field(
        default=0.00668,
        ge=0,
        le=1000,
        description="Predicted prefill time, milliseconds per computed token per 1,000 tokens of held "
        "context: their attention over the history (prior: Qwen3-32B on one H200).",
    )
    ttft_copy_fixed_ms: float = Field(
        default=1.0,
        ge=0,
        le=600_000,
        description="Predicted copy of KV between two engines, fixed milliseconds per pull (prior of "
        "every engine pair's learned copy cost).",
    )
    ttft_copy_token_ms: float = Field(
        default=0.004766,
        ge=0,
        le=1000,
        description="Predicted copy of KV between two engines, milliseconds per token (prior: "
        "Qwen3-32B's 262,144 bytes a token over 55 GB/s).",
    )
    ttft_inter_token_ms: float = Field(
        default=43.0,
        gt=0,
        le=600_000,
        description="A decode engine's milliseconds between output tokens until its turns report "
        "their own (Qwen3-32B on one H200).",
    )
    ttft_learning_turns: float = Field(
        default=30.0,
        ge=0,
        le=100_000,
        description="How fast learned costs follow the engines: a reported turn this many reports "
        "old weighs 1/e of the newest; 0: learn nothing, plan from the configured costs alone.",
    )
    decode_prefill_itl_bound: float = Field(
        default=0.2,
        ge=0,
        le=100,
        description="A prefill on the decode engine holding the history (for callers that can send "
        "it there: the gateway) may raise that engine's p99 inter-token latency by at most this "
        "share; 0: never prefill on the decode engine.",
    )
    prefill_engines: Annotated[StaticEngines, Flag("--prefill", "[NAME=]URL")] = Field(
        default_factory=list, description="Static prefill engines, `URL` or `NAME=URL` (the variable: "
        "comma-separated; the flag: repeated); none: engines come from the registry."
    )
    decode_engines: Annotated[StaticEngines, Flag("--decode", "[NAME=]URL")] = Field(
        default_factory=list, description="Static decode engines, `URL` or `NAME=URL` (the variable: "
        "comma-separated; the flag: repeated); none: engines come from the registry."
    )
    engine_refresh_seconds: float = Field(
        default=1.0, gt=0, le=3600, description="Seconds between engine-pool refreshes from the registry."
    )
    health_check_seconds: float = Field(
        default=2.0, ge=0, le=3600, description="Seconds between static engines' /health probes; 0: off."
    )
    health_check_failures: int = Field(
        default=2, ge=1, le=100, description="Failed probes in a row before a static engine leaves the pool."
    )
    inflight_token_weight: int = Field(
        default=256, ge=0, description="Prompt tokens one in-flight turn counts as in prefill load."
    )
    plan_memory_seconds: float = Field(
        default=900.0, ge=1, le=86400, description="Seconds plans stay in memory for ReportTurn and retries."
    )
    plan_memory_max: int = Field(default=100_000, ge=100, description="Plans kept in memory at most.")
    plan_memory_mb: float = Field(
        default=64.0,
        ge=1,
        le=65536,
        description="Estimated megabytes of plans kept in memory at most (a PULL plan holds its "
        "handle's block ids); the oldest leave first and are read back from turn_plans.",
    )
    max_prompt_tokens: int = Field(default=4_194_304, ge=1, description="Longest prompt accepted.")
    audit_flush_ms: float = Field(
        default=100.0, gt=0, le=60_000, description="Milliseconds between turn_plans batch writes."
    )
    audit_wait_ms: float = Field(
        default=1000.0,
        ge=0,
        le=60_000,
        description="Longest a PlanTurn or ReportTurn answer waits for its turn_plans row to be "
        "written; past it the row goes to the audit spool before the answer, counted in "
        "boomerang_router_audit_rows_unconfirmed. 0: answer at once (a router killed then loses the row).",
    )
    audit_batch_size: int = Field(default=500, ge=1, le=1000, description="turn_plans rows per write.")
    audit_queue_max: int = Field(
        default=100_000, ge=1, description="Unwritten turn_plans rows kept in memory between flushes."
    )
    audit_spool_dir: str = Field(
        default=".boomerang/router-audit-spool",
        description="Directory of the on-disk spool of turn_plans rows Postgres could not take "
        "(fsync'd, replayed when it answers and on start); empty: no spool, such rows are dropped.",
    )
    audit_spool_max_bytes: int = Field(
        default=1 << 30, ge=4096, description="Bytes the audit spool may hold; beyond, rows are dropped and counted."
    )
    breaker_failures: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="Registry failures in a row before plans stop asking for a while; 0: never stop.",
    )
    breaker_cooldown_seconds: float = Field(
        default=1.0, ge=0, le=600, description="Seconds plans stop asking a failing registry."
    )
    report_timeout_seconds: float = Field(
        default=5.0, gt=0, le=600, description="Deadline of each registry call ReportTurn makes."
    )
    remote_host_from_url: bool = Field(
        default=False,
        description="Register a decode handle's remote_host as the host of the decode engine's "
        "URL (as vLLM's proxy rewrites it) instead of the host D reported.",
    )
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest gRPC message accepted."
    )

    @field_validator("registry_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_listen(value)
