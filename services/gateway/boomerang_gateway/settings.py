"""Settings of the OpenAI-compatible gateway (`boomerang gateway`), from `BOOMERANG_*` variables and flags."""

from __future__ import annotations

from typing import Annotated, Any

from boomerang_server.config import EnginePoolSettings, Flag, Listen, check_listen
from boomerang_server.enginepool import StaticEngines
from pydantic import Field, field_validator
from pydantic_settings import NoDecode


class GatewaySettings(EnginePoolSettings):
    """Settings of the OpenAI-compatible gateway (`boomerang gateway`)."""

    listen: Listen = Field(
        default="127.0.0.1:8000", description="HTTP listen address (port 0: a free one)."
    )
    db_pool_size: int = Field(default=2, ge=1, le=200, description="Connections per process.")
    router_address: Annotated[str, Flag("--router", "HOST:PORT")] = Field(
        default="127.0.0.1:50052", description="HOST:PORT of the router; empty: no router."
    )
    prefill_engines: Annotated[StaticEngines, Flag("--prefill", "[NAME=]URL")] = Field(
        default_factory=list,
        description="Static prefill engines, `URL` or `NAME=URL` (the variable: comma-separated; the flag: "
        "repeated); none: engines come from the registry.",
    )
    decode_engines: Annotated[StaticEngines, Flag("--decode", "[NAME=]URL")] = Field(
        default_factory=list,
        description="Static decode engines, `URL` or `NAME=URL` (the variable: comma-separated; the flag: repeated).",
    )
    allow_anonymous: bool = Field(
        default=False, description="Serve requests without an API key as tenant `anonymous`."
    )
    tokenize_timeout_seconds: float = Field(
        default=1.0, gt=0, le=60, description="Deadline of the prefill engine's /tokenize."
    )
    tokenizers: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Models whose prompts the gateway tokenizes in-process, comma-separated `MODEL=LOCATION`: a "
        "folder with the model's tokenizer.json and tokenizer_config.json, or a Hugging Face repo id found in "
        "BOOMERANG_TOKENIZER_HF_CACHE (`MODEL` alone: the model's name is the repo id). Nothing is downloaded; "
        "other models, and a model whose ids once differ from the engine's, use the prefill engine's /tokenize.",
    )
    tokenizer_hf_cache: str = Field(
        default="",
        description="Hugging Face hub cache holding BOOMERANG_TOKENIZERS repo ids; empty: HF_HUB_CACHE, else "
        "HF_HOME/hub, else ~/.cache/huggingface/hub.",
    )
    plan_timeout_seconds: float = Field(
        default=0.25, gt=0, le=30, description="Deadline of PlanTurn; past it the turn recomputes."
    )
    report_turn_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Deadline of ReportTurn."
    )
    report_commit_timeout_seconds: float = Field(
        default=2.0,
        ge=0,
        le=120,
        description="Longest a finished turn holds its last byte until ReportTurn is answered "
        "(the next turn's lease committed); past it the turn ends anyway. 0: do not wait.",
    )
    control_plane_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        le=300,
        description="Once the router is unreachable (or late or failing three plans in a row), seconds to go "
        "straight to plain prefill→decode.",
    )
    engine_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, description="Connect timeout to engines."
    )
    engine_timeout_seconds: float = Field(
        default=600.0, gt=0, le=86400, description="Longest wait for an engine's next bytes."
    )
    engine_refresh_seconds: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Seconds between refreshes of the gateway's engines and models.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)."
    )
    tenant_requests_per_second: float = Field(
        default=0.0, ge=0, description="Average requests per second per tenant (429 past it); 0: unlimited."
    )
    tenant_burst: int = Field(default=50, ge=1, le=100_000, description="Requests a tenant may send at once.")
    key_cache_seconds: float = Field(
        default=30.0, ge=0, le=3600, description="Seconds a verified API key is cached."
    )
    engine_hook: bool = Field(
        default=False,
        description="The engines run Boomerang's vLLM hook: the gateway makes no /tokenize, PlanTurn or "
        "ReportTurn call and only routes, naming each turn's conversation and tenant to the prefill engine "
        "(`kv_transfer_params.boomerang`).",
    )
    prefill_on_decode: bool = Field(
        default=False,
        description="Let the router plan a turn as a prefill on the decode engine that holds the "
        "conversation's history (PREFILL_ON_DECODE: the request goes straight to that engine, with no "
        "kv_transfer_params) when that is predicted fastest within the router's inter-token-latency bound. "
        "Off unless set: that engine then keeps no handle for the next turn (vLLM retains a finished "
        "request's blocks only for a remote prefill), so the next turn pulls the older one.",
    )
    lease_summary: bool = Field(
        default=True,
        description="Watch the registry's summary of live leases (WatchLeaseKeys): a turn whose conversation "
        "surely has no live lease starts at once, COLD, with no tokenize or PlanTurn before its prefill (both "
        "run beside it, for the turn's report and to count a wrong \"no\"). Needs the registry address.",
    )
    sticky_prefill: bool = Field(
        default=False,
        description="Where the gateway picks the prefill engine itself (no router, reuse off, the router "
        "down), pick it by a hash of the conversation id, so each conversation's turns reach the same "
        "prefill engine and its own prefix cache; turns without a conversation id still go to the least busy.",
    )
    rewrite_remote_host: bool = Field(
        default=True,
        description="Set the prefill engine's kv_transfer_params.remote_host to the host the "
        "gateway reached it at (as vLLM's proxy does) before forwarding them to the decode engine.",
    )

    @field_validator("router_address")
    @classmethod
    def _optional_address(cls, value: str) -> str:
        return check_listen(value) if value else value

    @field_validator("tokenizers", mode="before")
    @classmethod
    def _tokenizers(cls, value: Any) -> dict[str, str]:
        """`MODEL=LOCATION` entries (or `MODEL`, a Hugging Face repo id) from a mapping or a
        comma-separated string."""
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        out: dict[str, str] = {}
        for item in str(value or "").split(","):
            if not item.strip():
                continue
            model, _, location = item.partition("=")
            model, location = model.strip(), (location.strip() or model.strip())
            if not model:
                raise ValueError(f"{item!r} must be MODEL=LOCATION or a Hugging Face repo id")
            out[model] = location
        return out
