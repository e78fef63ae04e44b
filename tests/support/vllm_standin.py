"""A stand-in for vLLM's scheduler-side NixlConnector and Request, following
docs/vllm-contract.md.

For fast unit tests only: tests/vllm/ drives vLLM 0.33.0's real scheduler and connector,
and its test_connector_surface.py fails when this stand-in drifts from them.

Only what the hook relies on, to the field: `Request.kv_transfer_params`,
`prompt_token_ids`, `all_token_ids` (prompt plus output), `request_id`,
`num_computed_tokens`, `num_preemptions`; the connector's
`get_num_new_matched_tokens(request, num_computed_tokens) -> (int | None, bool)`,
`update_state_after_alloc(request, blocks, num_external_tokens)` and, because the
NixlConnector supports the hybrid KV-cache manager, `request_finished_all_groups(request,
block_ids: tuple[list[int], ...]) -> (delay_free, kv_transfer_params | None)` (vLLM's
scheduler calls `request_finished(request, block_ids: list[int])` only on connectors
without that support). The NixlConnector's rules: P pulls when the request carries a
complete handle and loads `min(remote_num_tokens, prompt) − computed` tokens, recomputing
(and freeing D's blocks) below `kv_recompute_threshold`; D returns its bidirectional
handle (block ids as the tuple of lists it was given, `remote_num_tokens` = the request's
computed tokens: everything but the last sampled token) only for requests that finished
normally; P returns its own params for D.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

FINISHED_NORMALLY = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


class KVConnectorRole(enum.Enum):
    """vLLM's `KVConnectorRole`."""

    SCHEDULER = 0
    WORKER = 1


@dataclass
class Request:
    """The fields of vLLM's `vllm.v1.request.Request` the connector reads."""

    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    sampling_params: Any = None
    status: str = "WAITING"
    num_preemptions: int = 0

    @property
    def num_computed_tokens(self) -> int:
        """Tokens with KV: everything but the last sampled token, which has none yet."""
        return len(self.all_token_ids) - (1 if self.output_token_ids else 0)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt plus generated tokens."""
        return [*self.prompt_token_ids, *self.output_token_ids]


def vllm_config(
    engine_id: str,
    extra: dict[str, Any],
    *,
    block_size: int = 16,
    model: str = "qwen3-32b",
) -> SimpleNamespace:
    """The parts of `VllmConfig` the connector reads."""
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector="BoomerangConnector",
            kv_connector_module_path="boomerang_vllm_hook.connector",
            kv_role={"prefill": "kv_producer", "decode": "kv_consumer"}.get(
                str((extra.get("boomerang") or {}).get("role")), "kv_producer"),
            engine_id=engine_id,
            kv_connector_extra_config=extra,
        ),
        cache_config=SimpleNamespace(block_size=block_size),
        model_config=SimpleNamespace(model=f"org/{model}", served_model_name=[model]),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1, data_parallel_rank=0
        ),
    )


class StandInNixlConnector:
    """The NixlConnector's scheduler-side behaviour as docs/vllm-contract.md states it."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        kv = vllm_config.kv_transfer_config
        extra = kv.kv_connector_extra_config
        self.engine_id = kv.engine_id
        self.role = role
        self.bidirectional = bool(extra.get("bidirectional_kv_xfer", False))
        self.ttl = int(extra.get("decoder_kv_blocks_ttl", 480))
        self.threshold = int(extra.get("kv_recompute_threshold", 64))
        self.block_size = vllm_config.cache_config.block_size
        self.host, self.port, self.generation = "127.0.0.1", 5600, 1
        self.connector_scheduler = (
            SimpleNamespace(
                engine_id=self.engine_id,
                side_channel_host=self.host,
                side_channel_port=self.port,
                registration_generation=self.generation,
            )
            if role == KVConnectorRole.SCHEDULER
            else None
        )
        self.pulls: list[tuple[str, str, int]] = []  # (request id, D's request id, tokens read)
        self.frees: list[str] = []  # D request ids told to free without a read

    @staticmethod
    def _pull_handle(params: dict[str, Any] | None) -> bool:
        return bool(
            params
            and params.get("do_remote_decode") is True
            and params.get("remote_block_ids")
            and all(params.get(k) is not None for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"))
        )

    def _count(self, request: Request, num_computed_tokens: int) -> int:
        params = request.kv_transfer_params or {}
        return min(int(params.get("remote_num_tokens") or 0), len(request.prompt_token_ids)) - num_computed_tokens

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens to load from the remote engine, and whether asynchronously."""
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            return len(request.prompt_token_ids) - num_computed_tokens, True
        if self._pull_handle(params):
            count = self._count(request, num_computed_tokens)
            if 0 < count < self.threshold or count <= 0:
                return 0, False
            return count, True
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: Any, num_external_tokens: int) -> None:
        """Start the read (or tell D to free the handle it will not read)."""
        params = request.kv_transfer_params
        if self._pull_handle(params):
            assert params is not None
            if num_external_tokens > 0:
                self.pulls.append((request.request_id, params["remote_request_id"], num_external_tokens))
            else:
                self.frees.append(params["remote_request_id"])

    def shutdown(self) -> None:
        """vLLM calls it when the engine core stops; the stand-in holds nothing to release."""

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """Called once at the end of every `schedule()`; the stand-in has nothing to send."""
        return SimpleNamespace(reqs_to_recv={})

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """The non-HMA path: one KV-cache group's block ids."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """(delay_free, kv_transfer_params): P's params for D, or D's bidirectional handle."""
        if request.status not in FINISHED_NORMALLY:
            return False, None
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode"):  # a prefill request: D reads P's blocks next
            return True, {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": block_ids,
                "remote_engine_id": self.engine_id,
                "remote_request_id": request.request_id,
                "remote_host": self.host,
                "remote_port": self.port,
                "tp_size": 1,
            }
        if not self.bidirectional:
            return False, None
        return True, {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_block_ids": block_ids,
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": request.num_computed_tokens,
            "remote_blocks_expiry_time": time.perf_counter() + self.ttl,
            "remote_registration_generation": self.generation,
            "transfer_mode": "pull",
        }


def block_ids_for(num_tokens: int, block_size: int, start: int = 0) -> tuple[list[int], ...]:
    """One KV-cache group of consecutive block ids covering `num_tokens`, shaped as vLLM's
    scheduler passes them to `request_finished_all_groups`."""
    return (list(range(start, start + -(-num_tokens // block_size))),)


def ask(connector: Any, request: Request, num_computed_tokens: int, timeout: float = 10.0) -> tuple[int | None, bool]:
    """`get_num_new_matched_tokens` as vLLM's scheduler asks it: again at each step (here every
    millisecond) while the answer is "ask again later", `(None, False)`."""
    end = time.monotonic() + timeout
    while True:
        got: tuple[int | None, bool] = connector.get_num_new_matched_tokens(request, num_computed_tokens)
        if got[0] is not None or time.monotonic() > end:
            return got
        time.sleep(0.001)
