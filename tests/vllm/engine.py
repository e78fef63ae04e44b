"""One engine's scheduler side, as vLLM 0.33.0 runs it: the real v1 `Scheduler`, `Request`,
`SamplingParams`, `ModelRunnerOutput` and `KVConnectorOutput`, with the connector created by
vLLM's own `KVConnectorFactory` from the README's `--kv-transfer-config`.

What does not run here is the GPU side: the model runner and the NIXL transfer. `step()`
stands in for them the way vLLM's own scheduler tests do: every scheduled request samples
one token, and every receive the connector's metadata asks for completes by the next step
(`finished_recving`), as a NIXL read that succeeded would report it. The tokens sampled are
a fixed function of the request and position, so runs are repeatable.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
MODEL = "tiny-llama"
# A two-layer Llama config: enough for vLLM to build a ModelConfig without weights.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


def tiny_model(directory: Path) -> Path:
    """Write the model config vLLM reads (no weights, no tokenizer)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


# The roles vLLM 0.33.0 asks for (it deprecates `kv_both` for the NixlConnector); the pull
# connector's bidirectional transfer does not depend on them, which the suite shows.
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


def kv_transfer_config(engine_id: str, boomerang: dict[str, Any]) -> dict[str, Any]:
    """The README's `--kv-transfer-config`, with this engine's id and Boomerang settings
    (with `{"role": ...}` alone: vLLM's own NixlConnector, Boomerang absent)."""
    if set(boomerang) == {"role"}:
        return {
            "kv_connector": "NixlConnector",
            "kv_role": KV_ROLES[boomerang["role"]],
            "engine_id": engine_id,
            "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480,
                                          "kv_recompute_threshold": 64},
        }
    return {
        "kv_connector": "BoomerangConnector",
        "kv_connector_module_path": "boomerang_vllm_hook.connector",
        "kv_role": KV_ROLES[boomerang["role"]],
        "engine_id": engine_id,
        "kv_connector_extra_config": {
            "bidirectional_kv_xfer": True,
            "decoder_kv_blocks_ttl": 480,
            "kv_recompute_threshold": 64,
            "boomerang": boomerang,
        },
    }


@dataclass
class Finished:
    """What the engine core returns for a finished request."""

    request_id: str
    reason: str
    output_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None


@dataclass
class MatchCall:
    """One call vLLM's scheduler made to `get_num_new_matched_tokens`, and its answer."""

    request_id: str
    num_computed_tokens: int
    result: tuple[int | None, bool]
    remote_num_tokens: int | None


@dataclass
class Engine:
    """A prefill or decode engine's scheduler, stepped by hand."""

    engine_id: str
    scheduler: Scheduler
    matches: list[MatchCall] = field(default_factory=list)
    receives: dict[str, Any] = field(default_factory=dict)  # request id -> ReqMeta (NIXL recv queued)
    step_seconds: list[float] = field(default_factory=list)
    new_per_step: list[set[str]] = field(default_factory=list)  # requests first scheduled, per step
    scheduled: list[int] = field(default_factory=list)  # requests scheduled, per step
    metas: list[Any] = field(default_factory=list)  # the connector metadata of each step
    # The NIXL worker's side, where a test runs vLLM's own: the metadata in, finished_sending out.
    worker: Callable[[Any], set[str]] | None = None
    _pending_recv: set[str] = field(default_factory=set)
    _outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def connector(self) -> Any:
        """The connector vLLM built (a BoomerangConnector)."""
        return self.scheduler.connector

    @property
    def hook(self) -> Any:
        """Boomerang's hook inside the connector (None without Boomerang)."""
        return getattr(self.connector, "boomerang", None)

    def spy(self) -> None:
        """Record every `get_num_new_matched_tokens` call the scheduler makes (calls through)."""
        real: Callable[..., tuple[int | None, bool]] = self.connector.get_num_new_matched_tokens

        def recorded(request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
            result = real(request, num_computed_tokens)
            params = request.kv_transfer_params or {}
            self.matches.append(MatchCall(request.request_id, num_computed_tokens, result, params.get("remote_num_tokens")))
            return result

        self.connector.get_num_new_matched_tokens = recorded

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, kv_transfer_params: dict[str, Any] | None,
               cache_salt: str | None = None) -> Request:
        """Add a request as vLLM's engine core does: params ride in the sampling params' extra args,
        and the body's `cache_salt` becomes `Request.cache_salt`."""
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
        request = Request(request_id, list(prompt), params, None, cache_salt=cache_salt)
        self.scheduler.add_request(request)
        return request

    def abort(self, request_ids: Iterable[str]) -> None:
        """A client went away: vLLM's scheduler finishes the requests as aborted."""
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def _token(self, request_id: str, position: int) -> int:
        return 20_000 + zlib.crc32(f"{request_id}:{position}".encode()) % 10_000

    def step(self) -> list[Finished]:
        """One scheduler step, the model runner's output for it, and what finished."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        self.step_seconds.append(time.perf_counter() - started)
        self.new_per_step.append({r.req_id for r in out.scheduled_new_reqs})
        self.scheduled.append(len(out.num_scheduled_tokens))
        meta = out.kv_connector_metadata
        self.metas.append(meta)
        finished_sending = self.worker(meta) if self.worker is not None and meta is not None else set()
        for rid, req_meta in getattr(meta, "reqs_to_recv", {}).items():
            self.receives[rid] = req_meta
            self._pending_recv.add(rid)
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            done_prefill = request.num_computed_tokens + out.num_scheduled_tokens[rid] >= request.num_prompt_tokens
            sampled.append([self._token(rid, request.num_tokens)] if done_prefill else [])
        finished_recving, self._pending_recv = self._pending_recv, set()
        runner = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=finished_recving or None,
                                                  finished_sending=finished_sending or None),
        )
        results = self.scheduler.update_from_output(out, runner)
        done: list[Finished] = []
        for outputs in results.values():
            for o in outputs.outputs:
                self._outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    done.append(Finished(o.request_id, str(o.finish_reason), self._outputs.pop(o.request_id), o.kv_transfer_params))
        return done

    def run(self, request_ids: Iterable[str], timeout: float = 20.0, pause: float = 0.001) -> dict[str, Finished]:
        """Step, as vLLM's engine loop does, until every named request finished. A step
        that schedules nothing (the requests wait for their plans) is followed by a short
        pause, as an idle engine loop turns again."""
        wanted, got = set(request_ids), {}
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for f in self.step():
                got[f.request_id] = f
            if wanted <= set(got):
                return got
            if not self.scheduled[-1]:
                time.sleep(pause)
        raise AssertionError(f"{sorted(wanted - set(got))} did not finish in {timeout} s")

    def shutdown(self) -> None:
        """vLLM's own shutdown path for the connector (flushes the hook's senders)."""
        self.connector.shutdown()


def build_engine(model_dir: Path, engine_id: str, boomerang: dict[str, Any], num_blocks: int = 4000,
                 max_num_seqs: int = 128) -> Engine:
    """An engine configured exactly by the README's `--kv-transfer-config`."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    args = EngineArgs(
        model=str(model_dir),
        served_model_name=[MODEL],
        skip_tokenizer_init=True,
        kv_transfer_config=kv_transfer_config(engine_id, boomerang),  # type: ignore[arg-type]
        block_size=BLOCK_SIZE,
        max_model_len=16384,
        max_num_batched_tokens=65536,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=False,  # as in AWS's tests: P recomputes what it does not pull
        enforce_eager=True,
        dtype="float32",
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])
    scheduler = Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
    )
    engine = Engine(engine_id, scheduler)
    engine.spy()
    return engine
