"""The hook's settings, read from vLLM's `kv_connector_extra_config`.

The NixlConnector's own keys sit at the top level of `kv_connector_extra_config`
(`bidirectional_kv_xfer`, `decoder_kv_blocks_ttl`, `kv_recompute_threshold`); Boomerang's
live in its `boomerang` object. Everything is validated when the engine starts, and a bad
value stops it with one message naming every bad key, e.g.
`kv_connector_extra_config.boomerang.plan_deadline_ms: must be at most 1000`.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from boomerang.auth import TlsFiles, client_token
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PREFIX = "kv_connector_extra_config"


class HookConfigError(ValueError):
    """The hook's configuration is invalid; the message names every bad key."""


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:50051")
    return value


class BoomerangHookConfig(BaseModel):
    """`kv_connector_extra_config["boomerang"]`: what the hook needs to reach Boomerang."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["prefill", "decode"] = Field(
        description="Required. This engine's part: `prefill` plans turns, `decode` registers retained blocks."
    )
    registry: str = Field(
        default="",
        description="The block registry's HOST:PORT. Required for decode; optional for prefill "
        "(then the prefill engine does not register itself).",
    )
    router: str = Field(default="", description="The router's HOST:PORT. Required for prefill.")
    tenant: str = Field(
        default="",
        max_length=128,
        description="The tenant of requests that name none (and of all requests unless "
        "`trust_request_tenant`).",
    )
    trust_request_tenant: bool = Field(
        default=False,
        description="Take the tenant from each request's `boomerang.tenant`. Only when the engine "
        "is reachable solely through a trusted gateway that sets it from the caller's API key.",
    )
    auth_token: str = Field(
        default="",
        description="Bearer token (`boomerang credentials create engine:ENGINE_ID`); defaults to "
        "$BOOMERANG_AUTH_TOKEN, which keeps it out of the command line.",
    )
    tls_cert_file: str = Field(default="", description="Client certificate (mutual TLS); defaults to $BOOMERANG_TLS_CERT_FILE.")
    tls_key_file: str = Field(default="", description="Its private key; defaults to $BOOMERANG_TLS_KEY_FILE.")
    tls_ca_file: str = Field(default="", description="CA that signs the services; defaults to $BOOMERANG_TLS_CA_FILE.")
    model: str = Field(default="", description="The served model name; defaults to vLLM's.")
    http_base_url: str = Field(
        default="",
        description="This engine's OpenAI-compatible base URL, registered so the router's pool can choose it.",
    )
    side_channel_host: str = Field(default="", description="NIXL side-channel host; defaults to vLLM's.")
    side_channel_port: int = Field(default=0, ge=0, le=65535, description="NIXL side-channel port; defaults to vLLM's.")
    registration_generation: int | None = Field(
        default=None, ge=0, description="The generation to register at start when vLLM does not expose one."
    )
    lease_summary: bool = Field(
        default=True,
        description="Prefill engines with `registry`: watch the registry's summary of live leases "
        "(WatchLeaseKeys) and let a request whose conversation (or, without one, whose prompt) surely has "
        "no live lease go on at once, its plan sent beside it to count a wrong \"no\".",
    )
    plan_deadline_ms: float = Field(
        default=20.0,
        gt=0,
        le=1000,
        description="The longest a prefill request is held back while its plan is in flight, in "
        "milliseconds (vLLM schedules the engine's other requests meanwhile). Defaults to 20.",
    )
    plan_wait_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="A request waits for its plan at most this share of the prefill time a pull "
        "could save it (tokens not in P's own cache × `prefill_ms_per_token`), within "
        "`plan_deadline_ms`; the router's claim waits by the same rule. 0: never wait (no plans).",
    )
    prefill_ms_per_token: float = Field(
        default=0.02061,
        gt=0,
        le=1000,
        description="Milliseconds of this engine's prefill per prompt token, to value a pull "
        "(default: a Qwen3-32B fit to AWS's published figures).",
    )
    plan_with: Literal["chain", "tokens"] = Field(
        default="chain",
        description="Send the router the prompt's token chain (built at `chain_block_size`) or its token ids.",
    )
    chain_block_size: int = Field(
        default=0, ge=0, le=1024, description="Block size of the prompt chain; 0 means the engine's own."
    )
    breaker_failures: int = Field(
        default=3, ge=1, le=1000, description="Consecutive failed plans before planning pauses."
    )
    breaker_cooldown_seconds: float = Field(
        default=1.0, gt=0, le=300, description="First pause after the breaker opens; doubles up to 30 s."
    )
    queue_size: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Registrations (and reports) waiting to be sent, at most."
    )
    when_full: Literal["drop_oldest", "reject_new"] = Field(
        default="drop_oldest",
        description="What a full queue gives up: the oldest entry (closest to expiry) or the new one.",
    )
    batch_size: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="Registrations sent together in one RegisterRetainedBlocksBatch call, and reports in one "
        "ReportTurnBatch call.",
    )
    rpc_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="Deadline of background calls (registrations, heartbeats, reports)."
    )
    heartbeat_interval_seconds: float = Field(
        default=5.0, gt=0, le=300, description="Seconds between heartbeats to the registry."
    )
    release_interval_seconds: float = Field(
        default=0.5,
        ge=0,
        le=300,
        description="Decode engines: at most this many seconds between heartbeats, whose answers carry the turns "
        "nobody will pull any more (their blocks are freed at once); 0: only with the regular heartbeat.",
    )
    report_deadline_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="How long to keep retrying a turn report."
    )

    @field_validator("registry", "router")
    @classmethod
    def _addresses(cls, value: str) -> str:
        return _address(value) if value else value

    @field_validator("http_base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("tls_cert_file", "tls_key_file", "tls_ca_file")
    @classmethod
    def _pem(cls, value: str) -> str:
        if value and not os.path.isfile(value):
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _needs(self) -> BoomerangHookConfig:
        if self.role == "decode" and not self.registry:
            raise ValueError("a decode engine needs `registry` (HOST:PORT) to register its retained blocks")
        if self.role == "prefill" and not self.router:
            raise ValueError("a prefill engine needs `router` (HOST:PORT) to ask for plans")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("`tls_cert_file` and `tls_key_file` go together")
        if not self.tenant and not self.trust_request_tenant:
            raise ValueError("set `tenant`, or `trust_request_tenant: true` behind a gateway that names it")
        return self

    def token(self) -> str:
        """The bearer token: the configured one, else $BOOMERANG_AUTH_TOKEN, else none."""
        return self.auth_token or client_token()

    def tls(self) -> TlsFiles:
        """The TLS files: the configured ones, else the `BOOMERANG_TLS_*` variables."""
        if self.tls_cert_file or self.tls_ca_file:
            return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        return TlsFiles.from_env()


class HookConfig(BaseModel):
    """The whole `kv_connector_extra_config` as far as the hook reads it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    bidirectional_kv_xfer: bool = Field(
        default=False, description="vLLM's switch that makes decode nodes keep finished turns' blocks."
    )
    decoder_kv_blocks_ttl: int = Field(default=480, ge=1, le=86400, description="Seconds D keeps them.")
    kv_recompute_threshold: int = Field(default=64, ge=0, le=1_000_000, description="Tokens below which P recomputes.")
    boomerang: BoomerangHookConfig

    @field_validator("bidirectional_kv_xfer")
    @classmethod
    def _bidirectional(cls, value: bool) -> bool:
        if not value:
            raise ValueError("must be true: without it decode engines free every turn's blocks at once")
        return value


def parse_config(extra: dict[str, Any] | None) -> HookConfig:
    """Validate `kv_connector_extra_config`; HookConfigError lists every problem by key."""
    if not isinstance(extra, dict) or "boomerang" not in extra:
        raise HookConfigError(f'{PREFIX}.boomerang: is required (an object, e.g. {{"role": "decode", ...}})')
    try:
        return HookConfig.model_validate(extra)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{PREFIX}.{path}: {msg}" if path else f"{PREFIX}: {msg}")
        raise HookConfigError("invalid Boomerang hook configuration:\n  " + "\n  ".join(lines)) from None
