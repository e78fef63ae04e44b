"""`boomerang sim --hook`: the simulated engine runs Boomerang's vLLM hook, the same code.

The hook is built exactly as `BoomerangConnector` builds it inside vLLM — `parse_config` on a
`kv_connector_extra_config`, `engine_facts` from a config shaped like vLLM's, then
`BoomerangHook` with its planner, registration sender and turn reporter
(`boomerang_vllm_hook`) — and it is called where vLLM's scheduler calls the connector:

* before the engine reads a request's `kv_transfer_params`: `before_match` (a prefill
  engine starts a plan from its own token ids in the background; while it is in flight the
  hook answers "ask again later", and the simulated scheduler asks again a step later, as
  vLLM does; a PULL plan's params are then merged into the request);
* once the request holds its blocks: `after_alloc`;
* when it ends, however it ends: `on_finished` with what the NixlConnector would return (a
  decode engine queues the registration of its retained blocks; a prefill engine reports
  its plan and adds the conversation to the params it returns for D).

Every call runs on one thread of its own, the simulated scheduler thread, so the hook sees
its calls one at a time, as it does in vLLM. The time those calls hold that thread is what
the engine's scheduler loop spends on Boomerang (`scheduler_ms_total`, `scheduler_ms_max` in
the stats): a step's CPU, never a wait on the network. The hook's own sender registers the
engine and heartbeats (the simulator's `--registry` loop does not run in this mode).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from boomerang_vllm_hook.config import parse_config
from boomerang_vllm_hook.hook import BoomerangHook
from boomerang_vllm_hook.sender import engine_facts

from boomerang_tools.sim.state import GenRequest, SimConfig

log = logging.getLogger(__name__)
# How long the simulated scheduler takes to ask again about a request whose plan is in
# flight: vLLM's next step (an idle engine loops at once; a busy one after a forward pass).
ASK_AGAIN_SECONDS = 0.002


@dataclass(frozen=True)
class HookOptions:
    """What `boomerang sim --hook` passes to the hook's `boomerang` settings."""

    registry: str = ""
    router: str = ""
    tenant: str = "anonymous"
    plan_deadline_ms: float = 20.0
    plan_wait_share: float = 0.25
    heartbeat_interval_seconds: float = 2.0
    prefill_ms_per_token: float | None = None  # None: the profile's own (its β)


@dataclass
class SimRequest:
    """The fields of vLLM's `Request` the hook reads, for one simulated request."""

    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None
    output_token_ids: list[int] = field(default_factory=list)
    sampling_params: Any = None
    num_preemptions: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt plus output, as vLLM's `Request.all_token_ids`."""
        return [*self.prompt_token_ids, *self.output_token_ids]

    @property
    def num_computed_tokens(self) -> int:
        """Tokens with KV: everything but the last sampled token."""
        return len(self.all_token_ids) - (1 if self.output_token_ids else 0)


def extra_config(config: SimConfig, options: HookOptions, http_base_url: str) -> dict[str, Any]:
    """The engine's `kv_connector_extra_config`, as the README's `--kv-transfer-config` has it."""
    boomerang: dict[str, Any] = {
        "role": config.role,
        "tenant": options.tenant,
        # The simulated engines sit behind the gateway, which names each turn's tenant.
        "trust_request_tenant": True,
        "http_base_url": http_base_url,
        "side_channel_host": config.host,
        "side_channel_port": config.side_channel_port,
        "heartbeat_interval_seconds": options.heartbeat_interval_seconds,
        "model": config.served_model_name,
    }
    if options.registry:
        boomerang["registry"] = options.registry
    if config.role == "prefill":
        boomerang["router"] = options.router
        boomerang["plan_deadline_ms"] = options.plan_deadline_ms
        # The hook values a pull with the modelled engine's prefill cost (the cost model's β),
        # unscaled: `--time-scale` speeds the simulation up, the engine it models stays the same.
        boomerang["prefill_ms_per_token"] = (config.profile.beta_ms if options.prefill_ms_per_token is None
                                             else options.prefill_ms_per_token)
        boomerang["plan_wait_share"] = options.plan_wait_share
    return {
        "bidirectional_kv_xfer": True,
        "decoder_kv_blocks_ttl": max(1, round(config.ttl_seconds)),
        "kv_recompute_threshold": config.recompute_threshold,
        "boomerang": boomerang,
    }


class SimHook:
    """Boomerang's vLLM hook inside one simulated engine."""

    def __init__(self, config: SimConfig, options: HookOptions, http_base_url: str, generation: int):
        hook_config = parse_config(extra_config(config, options, http_base_url))  # a bad flag stops the engine here
        vllm_config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(engine_id=config.engine_id),
            cache_config=SimpleNamespace(block_size=config.block_size),
            model_config=SimpleNamespace(model=config.served_model_name, served_model_name=[config.served_model_name]),
            parallel_config=SimpleNamespace(tensor_parallel_size=config.tp_size, pipeline_parallel_size=1,
                                            decode_context_parallel_size=1, data_parallel_rank=0),
        )
        scheduler = SimpleNamespace(engine_id=config.engine_id, side_channel_host=config.host,
                                    side_channel_port=config.side_channel_port, registration_generation=generation)
        self.clock_offset = config.clock_offset
        self.hook = BoomerangHook(hook_config, engine_facts(vllm_config, hook_config, scheduler))
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sim-scheduler")
        self._requests: dict[str, SimRequest] = {}
        self.scheduler_seconds = 0.0  # time hook calls held the scheduler thread
        self.scheduler_max = 0.0

    def start(self) -> None:
        """Start the hook's background workers (engine registration, heartbeats, reports)."""
        self.hook.start()

    async def close(self) -> None:
        """Flush the background workers briefly, then stop."""
        await asyncio.wrap_future(self._thread.submit(self.hook.close))
        self._thread.shutdown(wait=False)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(self._thread.submit(self._guard, fn, *args))

    def _guard(self, fn: Any, *args: Any) -> Any:
        # As the connector's overrides do: nothing the hook does may fail a request.
        started = time.perf_counter()
        try:
            return fn(*args)
        except Exception:
            log.exception("boomerang hook: %s failed; the request continues without Boomerang", fn.__name__)
            self.hook.counters["hook_errors"] += 1
            return None
        finally:
            took = time.perf_counter() - started
            self.scheduler_seconds += took
            self.scheduler_max = max(self.scheduler_max, took)

    async def before_admit(self, req: GenRequest, request_id: str) -> GenRequest:
        """`get_num_new_matched_tokens`: the hook may plan; the request as the engine then reads it."""
        params = req.kv_transfer_params
        request = SimRequest(request_id, list(req.prompt_ids), dict(params) if isinstance(params, dict) else params)
        self._requests[request_id] = request
        while await self._call(self.hook.before_match, request, 0) is False:
            await asyncio.sleep(ASK_AGAIN_SECONDS)  # skipped this step; the others go on
        return dataclasses.replace(req, kv_transfer_params=request.kv_transfer_params)

    async def allocated(self, request_id: str, num_external_tokens: int) -> None:
        """`update_state_after_alloc` then `build_connector_meta` (the step is over)."""
        request = self._requests.get(request_id)
        if request is not None:
            await self._call(self.hook.after_alloc, request, num_external_tokens)

    async def finished(self, request_id: str, output_ids: list[int], params: dict[str, Any] | None) -> dict[str, Any] | None:
        """`request_finished_all_groups`: the params the engine returns (P's gain the conversation)."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return params
        request.output_token_ids = list(output_ids)
        # D's expiry is on this engine's simulated clock; the hook compares it with the
        # process's perf_counter, which is the same clock in vLLM.
        seen = params
        if isinstance(params, dict) and isinstance(params.get("remote_blocks_expiry_time"), (int, float)):
            seen = {**params, "remote_blocks_expiry_time": params["remote_blocks_expiry_time"] - self.clock_offset}
        result = await self._call(self.hook.on_finished, request, (seen is not None, seen))
        out = params if result is None else result[1]
        return params if out is seen else out

    def aborted(self, request_id: str) -> None:
        """An aborted or refused request ends with no params (never awaited: it may run in a finally)."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._thread.submit(self._guard, self.hook.on_finished, request, (False, None))

    def stats(self) -> dict[str, Any]:
        """The hook's counters (plans by decision, fallbacks, the sender's and reporter's queues)."""
        stats: dict[str, Any] = self.hook.stats()
        stats["scheduler_ms_total"] = round(self.scheduler_seconds * 1000, 3)
        stats["scheduler_ms_max"] = round(self.scheduler_max * 1000, 3)
        return stats
