"""The prefill engine's scheduler step with plans in flight: Boomerang's share of `schedule()`.

vLLM's scheduler is synchronous, so whatever the hook's `get_num_new_matched_tokens` spends
is spent by every request on the engine. This phase drives the vLLM hook's own code
(`BoomerangHook`, built as the connector builds it) against the bench's router, as an engine
loop would call it: requests arrive at a steady rate, and every 2 ms a step asks the hook
about each waiting request. The figure per step is the time those calls took, i.e. what the
hook added to that `schedule()`. It is measured twice, the router near and then 120 ms away
(a relay holding the engine's bytes back), and beside it the synchronous plan this hook made
before plans went to the background (build the chain, then a blocking PlanTurn bounded by
`plan_deadline_ms`, per new request, inside the step), on the same requests.

`tests/vllm/test_scheduler_never_waits.py` checks the same inside vLLM's real `Scheduler`
(with this module's `DelayRelay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang_vllm_hook.config import parse_config
from boomerang_vllm_hook.hook import BoomerangHook
from boomerang_vllm_hook.requestview import TurnContext
from boomerang_vllm_hook.sender import engine_facts

from boomerang_tools.bench.context import Bench
from boomerang_tools.bench.report import summarize
from boomerang_tools.bench.workload import MODEL, conversation, next_prompt

STEP_SECONDS = 0.002  # an engine loop turning while requests wait for their plans
# GLM-5-FP8's prefill per token (the simulator's cost model): the preloaded conversations'
# next prompts (350 to 2,400 tokens) are worth waiting 8 to 53 ms for.
PREFILL_MS_PER_TOKEN = 0.08811
PLAN_DEADLINE_MS = 250.0
FAR_SECONDS = 0.12


@dataclass
class Req:
    """The fields of vLLM's `Request` the hook reads."""

    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict[str, Any]
    sampling_params: Any = None
    num_preemptions: int = 0


class DelayRelay:
    """Forwards 127.0.0.1:<port> to `upstream`, holding client bytes back `delay` seconds, as
    a far-away or overloaded peer would.

    Every chunk the client sends reaches the server `delay` seconds after it arrived (in
    order); the server's answers pass at once. Runs its own event loop on a daemon thread, so
    synchronous tests (vLLM's scheduler) can use it; `delay` may change while connections live.
    """

    def __init__(self, upstream: str, delay: float = 0.0):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.delay = delay
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="delay-relay", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> DelayRelay:
        """Listen on a free port (`address` then says where)."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay relay did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        # Stopped: close the listener and every connection's sockets, end their tasks, then
        # the loop (a socket still open when the loop closes is a ResourceWarning).
        self._server.close()
        for writer in self._writers:
            writer.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(asyncio.sleep(0.01))  # the transports' close callbacks
        self._writers.clear()
        self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.add(server_w)
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read_client() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await client_r.read(65536):
                    held.put_nowait((time.monotonic() + self.delay, data))
            held.put_nowait((0.0, b""))

        async def write_server() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    due, data = await held.get()
                    if not data:
                        break
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    server_w.write(data)
                    await server_w.drain()
            server_w.close()

        async def answer_client() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await server_r.read(65536):
                    client_w.write(data)
                    await client_w.drain()
            client_w.close()

        await asyncio.gather(read_client(), write_server(), answer_client(), return_exceptions=True)


def _hook(router: str, engine_id: str) -> BoomerangHook:
    extra = {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64,
             "boomerang": {"role": "prefill", "router": router, "trust_request_tenant": True, "model": MODEL,
                           "plan_deadline_ms": PLAN_DEADLINE_MS, "prefill_ms_per_token": PREFILL_MS_PER_TOKEN}}
    config = parse_config(extra)
    vllm = SimpleNamespace(kv_transfer_config=SimpleNamespace(engine_id=engine_id), cache_config=SimpleNamespace(block_size=16),
                           model_config=SimpleNamespace(model=MODEL, served_model_name=[MODEL]),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                                           decode_context_parallel_size=1, data_parallel_rank=0))
    hook = BoomerangHook(config, engine_facts(vllm, config))
    hook.start()
    return hook


def _requests(b: Bench, n: int, first: int, tag: str) -> list[Req]:
    """The next turns of `n` preloaded conversations with live leases (their plans PULL)."""
    out = []
    for i in range(n):
        c = conversation(2 * (first + i), b.cfg.tenants, b.cfg.decode_engines)
        out.append(Req(f"{tag}-{i}-{uuid.uuid4().hex[:6]}", next_prompt(c),
                       {"boomerang": {"conversation_id": c.conversation_id, "tenant": c.tenant}}))
    return out


def _background(hook: BoomerangHook, requests: list[Req], rate: float) -> list[float]:
    """Steps of an engine loop with plans in flight: the hook's time in each step (s)."""
    waiting: list[Req] = []
    arrivals = list(requests)
    steps: list[float] = []
    start = time.perf_counter()
    while arrivals or waiting:
        now = time.perf_counter() - start
        while arrivals and len(requests) - len(arrivals) < now * rate:
            waiting.append(arrivals.pop(0))
        began = time.perf_counter()
        ready = [r for r in waiting if hook.before_match(r, 0) is not False]
        took = time.perf_counter() - began
        if waiting:
            steps.append(took)
        for r in ready:
            waiting.remove(r)
            hook.on_finished(r, (False, None))
        time.sleep(STEP_SECONDS)
    return steps


def _synchronous(hook: BoomerangHook, requests: list[Req], rate: float) -> list[float]:
    """The same requests as the hook planned them before: one blocking plan per new request,
    inside the step that first saw it (its time in each step, s)."""
    planner = hook.planner
    assert planner is not None
    arrivals = list(requests)
    steps: list[float] = []
    start = time.perf_counter()
    while arrivals:
        now = time.perf_counter() - start
        new = []
        while arrivals and len(requests) - len(arrivals) < now * rate:
            new.append(arrivals.pop(0))
        began = time.perf_counter()
        for r in new:
            named = r.kv_transfer_params["boomerang"]
            ctx = TurnContext(named["tenant"], named["conversation_id"], prompt_tokens=len(r.prompt_token_ids))
            plan_started = time.perf_counter()
            req = planner.build_request(ctx, r.prompt_token_ids, r.request_id)
            left = planner.deadline - (time.perf_counter() - plan_started)
            try:
                planner.client.plan_turn(req, timeout=max(left, 0.001))
            except BoomerangClientError:
                pass  # a failed plan still cost the step its wait
        if new:
            steps.append(time.perf_counter() - began)
        time.sleep(STEP_SECONDS)
    return steps


def _summary(steps: list[float]) -> dict[str, Any]:
    s = summarize(x * 1000 for x in steps)
    return {"steps": s["count"], **{k: s[k] for k in ("p50_ms", "p99_ms", "max_ms")}}


def _measure(b: Bench, relay: DelayRelay, delay: float, count: int, rate: float, first: int) -> dict[str, Any]:
    relay.delay = 0.0
    tag = f"sched{first}"
    hook = _hook(relay.address, f"bench-{tag}-{uuid.uuid4().hex[:6]}")
    try:
        _background(hook, _requests(b, 2, first, f"{tag}-warm"), rate)  # the channel connects before the delay
        relay.delay = delay
        after = _background(hook, _requests(b, count, first + 2, f"{tag}-after"), rate)
        stats = hook.stats()
        before = _synchronous(hook, _requests(b, max(10, count // 3), first + 2 + count, f"{tag}-before"), rate)
    finally:
        hook.close(timeout=1.0)
    return {"router_delay_ms": delay * 1000, "background": _summary(after), "synchronous_before": _summary(before),
            "plans": {k: v for k, v in stats.items() if k.startswith(("plan_", "fallback_", "late_"))
                      and not k.startswith("plan_ms")}}


async def hook_schedule(b: Bench) -> dict[str, Any]:
    """The hook's time per `schedule()` step with plans in flight, router near and far, with
    plans in the background (today) and synchronous (before)."""
    count, rate = (30, 20.0) if b.cfg.quick else (90, 30.0)
    # Conversations from the last quarter of the planned ones (the plan phases' load spreads
    # over all of them; these few are consumed here).
    first = b.cfg.leases * 3 // 8
    relay = DelayRelay(b.router_address).start()
    try:
        near = await asyncio.to_thread(_measure, b, relay, 0.0, count, rate, first)
        far = await asyncio.to_thread(_measure, b, relay, FAR_SECONDS, count, rate, first + 2 * count)
    finally:
        relay.stop()
    return {"plan_deadline_ms": PLAN_DEADLINE_MS, "step_ms": STEP_SECONDS * 1000, "near": near, "far": far}
