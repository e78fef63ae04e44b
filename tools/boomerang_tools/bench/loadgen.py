"""Load generators: client processes that drive the services and time every call.

Each worker is a separate process (spawned, uvloop) with its own gRPC channels, so the
client side is not one Python event loop. Jobs arrive over a pipe; the orchestrator gives
every worker its own slice of conversations and the same wall-clock start.

- `plan`: open loop. Arrivals are Poisson at the worker's share of the rate, fixed before
  the start, and each call is sent at its arrival time whether or not earlier ones have
  answered (no coordinated omission). Latency is the call's own duration; how late each
  send left against its schedule is reported too, to show whether the generator kept up.
- `register`: closed loop, `concurrency` decode-node clients per worker calling
  RegisterRetainedBlocks back to back (each answer is an acknowledged commit).
- `turns`: chat turns three ways, interleaved in one run: through the gateway, through the
  naive proxy, and straight to the simulated engines (the client does the P→D hand-off
  itself); with `hook` in the job, the same three over a second pair of engines that run the
  vLLM hook (`sim --hook`, model `hook_model`): `hook` through a gateway in `--engine-hook`
  mode (the engines plan and register themselves), `naive-hook` and `direct-hook` with no
  conversation id (the hook is installed but does nothing), so each pair of engines carries
  the same load and hook mode is judged against its own direct path and naive proxy.

  Every path runs the same multi-turn conversations (the assistant's reply appended, a new
  user message each turn) at the same concurrency in the same seconds, so the machine's
  noise lands on all three alike. A turn's time is from sending the request to the last byte
  of the streamed answer. What a path *adds* is its time less the direct path's. A turn's end
  is the time from its finishing chunk (the one with `finish_reason`) to the end of the
  stream: where the gateway waits for ReportTurn's answer (the next turn's lease committed)
  before `[DONE]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import random
import time
import traceback
import uuid
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import grpc
import httpx
import uvloop
from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boomerang_tools.bench.database import block_ids
from boomerang_tools.bench.naive_proxy import FIRST_TURN
from boomerang_tools.bench.workload import BLOCK_SIZE, MODEL, chain_for, conversation, next_prompt
from boomerang_tools.demo.client import server_timing

Job = dict[str, Any]


class Workers:
    """A few load-generator processes, kept for the whole run."""

    def __init__(self, count: int, router: str, registry: str):
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs = []
        for i in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(theirs, i, router, registry), daemon=True,
                               name=f"bench-client-{i}")
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)

    @property
    def count(self) -> int:
        """How many workers."""
        return len(self.pipes)

    async def run(self, jobs: list[Job], timeout: float) -> list[dict[str, Any]]:
        """Give job i to worker i (fewer jobs: fewer workers) and gather the results."""
        for pipe, job in zip(self.pipes, jobs):
            pipe.send(job)

        def receive(pipe: Connection) -> dict[str, Any]:
            if not pipe.poll(timeout):
                raise TimeoutError(f"a load generator did not answer within {timeout:.0f}s")
            result = pipe.recv()
            if "error" in result:
                raise RuntimeError(f"load generator failed: {result['error']}")
            return result  # type: ignore[no-any-return]

        return list(await asyncio.gather(*(asyncio.to_thread(receive, p) for p in self.pipes[: len(jobs)])))

    def close(self) -> None:
        """Stop the workers."""
        for pipe in self.pipes:
            try:
                pipe.send({"kind": "stop"})
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def _worker_main(pipe: Connection, index: int, router: str, registry: str) -> None:
    uvloop.run(_serve(pipe, index, router, registry))


async def _serve(pipe: Connection, index: int, router: str, registry: str) -> None:
    loop = asyncio.get_running_loop()
    router_client = RouterClient(router, timeout=5.0, plan_timeout=2.0) if router else None
    registry_client = RegistryClient(registry, timeout=10.0) if registry else None
    handlers: dict[str, Callable[[Job], Awaitable[dict[str, Any]]]] = {
        "plan": lambda job: plan_job(router_client, job, index),
        "register": lambda job: register_job(registry_client, job, index),
        "turns": lambda job: turns_job(job, index),
        "health": lambda job: health_job(job, index),
    }
    try:
        while True:
            job = await loop.run_in_executor(None, pipe.recv)
            if job["kind"] == "stop":
                return
            try:
                result = await handlers[job["kind"]](job)
            except Exception as exc:  # noqa: BLE001 - reported to the orchestrator

                result = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            pipe.send(result)
    finally:
        for client in (router_client, registry_client):
            if client is not None:
                await client.close()


async def _wait_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


def schedule(rate: float, duration: float, seed: int, limit: int) -> list[float]:
    """Poisson arrival offsets (seconds) at `rate` per second over `duration`, at most `limit`."""
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration and len(out) < limit:
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def open_loop(
    offsets: list[float], start_at: float, send: Callable[[int], Awaitable[None]]
) -> list[float]:
    """Call `send(i)` at `start_at + offsets[i]` without waiting for answers; send lags in ms."""
    await _wait_until(start_at)
    base = time.perf_counter() - (time.time() - start_at)
    lags: list[float] = []
    tasks = []
    for i, at in enumerate(offsets):
        due = base + at
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
            now = time.perf_counter()
        lags.append((now - due) * 1000)
        tasks.append(asyncio.ensure_future(send(i)))
    await asyncio.gather(*tasks)
    return lags


async def plan_job(client: Any, job: Job, index: int) -> dict[str, Any]:
    """Open-loop PlanTurn calls over this worker's conversations."""
    offsets = schedule(job["rate"], job["duration"], job["seed"] * 31 + index, len(job["conversations"]))
    requests = []
    for k in job["conversations"][: len(offsets)]:
        c = conversation(k, job["tenants"], job["engines"])
        # "anonymous": no conversation id, the router finds the lease by the prompt it continues.
        conv = "" if job.get("anonymous") else c.conversation_id
        requests.append(rtpb.PlanTurnRequest(tenant=c.tenant, conversation_id=conv, model=MODEL,
                                             prompt_token_ids=next_prompt(c), request_id=uuid.uuid4().hex))
    latencies = array("d", [0.0] * len(offsets))
    decisions: Counter[str] = Counter()
    errors: Counter[str] = Counter()

    async def send(i: int) -> None:
        t0 = time.perf_counter()
        try:
            resp = await client.plan_turn(requests[i], timeout=2.0)
        except BoomerangClientError as err:
            latencies[i] = (time.perf_counter() - t0) * 1000
            errors[err.code] += 1
            return
        latencies[i] = (time.perf_counter() - t0) * 1000
        decisions[rtpb.PlanReason.Name(resp.reason).removeprefix("PLAN_REASON_")] += 1

    started = time.time()
    lags = await open_loop(offsets, job["start_at"], send)
    return {
        "latencies_ms": latencies.tobytes(),
        "send_lag_ms": array("d", lags).tobytes(),
        "reasons": dict(decisions),
        "errors": dict(errors),
        "elapsed_s": time.time() - max(started, job["start_at"]),
        "sent": len(offsets),
    }


async def register_job(client: Any, job: Job, index: int) -> dict[str, Any]:
    """Closed-loop RegisterRetainedBlocks from `concurrency` decode-node clients."""
    engines = job["engine_ids"]
    requests = []
    for n, k in enumerate(job["conversations"]):
        c = conversation(k, job["tenants"], job["engines"])
        # The conversation's next turn: it holds a few more tokens and supersedes the lease.
        grown = type(c)(c.index, c.tenant, c.conversation_id, c.engine, c.offset, c.num_tokens + 2 * BLOCK_SIZE + 3)
        chain = chain_for(grown)
        rid = f"chatcmpl-bench-{index}-{n}-{uuid.uuid4().hex[:8]}"
        requests.append(rpb.RegisterRetainedBlocksRequest(
            tenant=c.tenant, conversation_id=c.conversation_id, engine_id=engines[c.engine],
            engine_generation=job["generation"], remote_request_id=rid,
            block_groups=[tpb.BlockIdGroup(block_ids=g) for g in block_ids(grown)],
            num_tokens=grown.num_tokens,
            token_chain=chainproto.to_proto(chain),
            model=MODEL, request_id=uuid.uuid4().hex,
        ))
    await _wait_until(job["start_at"])
    end = time.perf_counter() + job["duration"]
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    cursor = iter(range(len(requests)))

    batch = int(job["batch"])

    async def client_loop() -> None:
        for i in cursor:
            if time.perf_counter() >= end:
                return
            t0 = time.perf_counter()
            # The call's turns: `batch` of them in one call, as a batching sender (the hook's
            # outbox) sends them.
            items = [requests[i], *(requests[j] for j in itertools.islice(cursor, batch - 1))]
            try:
                if batch > 1:
                    resp = await client.register_retained_blocks_batch(
                        rpb.RegisterRetainedBlocksBatchRequest(registrations=items), timeout=10.0)
                    outcomes.update(f"error_{r.error_reason}" if r.error_code else
                                    "created" if r.response.created else "repeated"
                                    for r in resp.results)
                else:
                    resp = await client.register_retained_blocks(requests[i], timeout=10.0)
                    outcomes["created" if resp.created else "repeated"] += 1
            except BoomerangClientError as err:
                outcomes[f"error_{err.code}_{err.reason}"] += len(items)
            latencies.append((time.perf_counter() - t0) * 1000)

    t_start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(job["concurrency"])))
    return {
        "latencies_ms": array("d", latencies).tobytes(),
        "outcomes": dict(outcomes),
        "elapsed_s": time.perf_counter() - t_start,
        "exhausted": next(cursor, None) is None,
    }


async def health_job(job: Job, index: int) -> dict[str, Any]:
    """Open-loop grpc.health.v1 Check calls: what one gRPC call costs with no work behind it."""
    channel = grpc.aio.insecure_channel(job["target"])
    stub = health_pb2_grpc.HealthStub(channel)
    await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    offsets = schedule(job["rate"], job["duration"], index + 7, 10**7)
    request = health_pb2.HealthCheckRequest()
    errors: Counter[str] = Counter()

    async def send(i: int) -> None:
        # A failed call is counted, as the plan jobs count theirs, not fatal to the run: the
        # floor is the CPU of the calls answered (seen here: a few CANCELLED at 1,000/s).
        try:
            await stub.Check(request, timeout=5)
        except grpc.aio.AioRpcError as err:
            errors[err.code().name] += 1

    try:
        await open_loop(offsets, job["start_at"], send)
    finally:
        await channel.close()
    return {"sent": len(offsets), "errors": dict(errors)}


WORDS = ["the", "decode", "node", "keeps", "every", "block", "of", "the", "finished", "turn", "so", "that", "the", "prefill", "node", "of", "the", "next", "turn", "can", "read", "them", "back", "instead", "of", "computing", "the", "whole", "history", "again"]
PATHS = ("direct", "naive", "boomerang", "direct-hook", "naive-hook", "hook")
HOOK_PATHS = ("direct-hook", "naive-hook", "hook")


def user_message(rng: random.Random, words: int) -> str:
    """A user message of about `words` words."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], ends: list[float] | None = None
) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
    """POST a streaming chat request; the reply text, the final kv_transfer_params, headers.

    `ends` gets the milliseconds from the finishing chunk to the end of the stream.
    """
    text: list[str] = []
    params = None
    finished_at = None
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code} from {url}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
                if choice.get("finish_reason") and finished_at is None:
                    finished_at = time.perf_counter()
            if isinstance(chunk.get("kv_transfer_params"), dict):
                params = chunk["kv_transfer_params"]
        if ends is not None and finished_at is not None:
            ends.append((time.perf_counter() - finished_at) * 1000)
        return "".join(text), params, dict(resp.headers)


class DirectClient:
    """The client does what a proxy would: P with the last handle, then D streaming."""

    def __init__(self, http: httpx.AsyncClient, prefill: str, decode: str):
        self.http, self.prefill, self.decode = http, prefill, decode
        self.kv: dict[str, dict[str, Any]] = {}

    async def turn(
        self, conversation_id: str, body: dict[str, Any], ends: list[float] | None = None
    ) -> tuple[str, dict[str, str], bool]:
        """One turn; the reply, headers, whether a handle was passed to P."""
        handle = self.kv.pop(conversation_id, None)
        p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params=handle or dict(FIRST_TURN))
        p_body.pop("stream_options", None)
        p = await self.http.post(self.prefill + "/v1/chat/completions", json=p_body)
        p.raise_for_status()
        params = p.json().get("kv_transfer_params")
        text, d_params, headers = await _stream(self.http, self.decode + "/v1/chat/completions",
                                                dict(body, kv_transfer_params=params), ends)
        if d_params is not None:
            self.kv[conversation_id] = d_params
        return text, headers, handle is not None


async def turns_job(job: dict[str, Any], index: int) -> dict[str, Any]:
    """Conversations on the job's `paths` (`slots` at once on each) until the duration is over."""
    http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
    # A path's base URL (both engines' for the direct paths), from the job's keys; a job that
    # runs only some paths leaves the others' out.
    direct = {path: DirectClient(http, job.get(f"prefill{key}", ""), job.get(f"decode{key}", ""))
              for path, key in (("direct", ""), ("direct-hook", "_hook"))}
    urls = {path: job.get(key, "") + "/v1/chat/completions"
            for path, key in (("naive", "naive"), ("boomerang", "gateway"), ("hook", "hook"),
                              ("naive-hook", "naive_hook"))}
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    ends: dict[str, list[float]] = {p: [] for p in PATHS}
    stages: dict[str, list[float]] = {}
    plans: Counter[str] = Counter()
    hook_plans: Counter[str] = Counter()  # the hook path's X-Boomerang-Plan (ENGINE: the engine planned)
    reused: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    done: Counter[str] = Counter()  # every answered turn, first turns too
    end = 0.0

    async def conversation_loop(path: str, slot: int) -> None:
        rng = random.Random(hash((index, path, slot)))
        for n in itertools.count():
            cid = f"bench-{path}-{index}-{slot}-{n}-{uuid.uuid4().hex[:6]}"
            system = user_message(rng, job["system_words"]) if job.get("system_words") else "You are a helpful assistant."
            messages = [{"role": "system", "content": system}]
            for turn in range(job["turns_per_conversation"]):
                if time.perf_counter() >= end:
                    return
                messages.append({"role": "user", "content": user_message(rng, job["words"])})
                model = job["hook_model"] if path in HOOK_PATHS else job["model"]
                body = {"model": model, "messages": list(messages), "max_tokens": job["max_tokens"], "stream": True}
                t0 = time.perf_counter()
                end_ms: list[float] = []
                try:
                    if path in direct:
                        text, headers, had = await direct[path].turn(cid, body, end_ms)
                        reused[path] += had
                    else:
                        text, _, headers = await _stream(http, urls[path], dict(body, conversation_id=cid), end_ms)
                except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                    errors[f"{path}:{type(exc).__name__}"] += 1
                    break
                elapsed = (time.perf_counter() - t0) * 1000
                done[path] += 1
                if turn >= 1:  # first turns are cold everywhere; compare the reuse turns
                    times[path].append(elapsed)
                    ends[path].extend(end_ms)
                    if path in ("hook", "boomerang"):
                        plan = headers.get("x-boomerang-plan", "?")
                        (plans if path == "boomerang" else hook_plans)[plan] += 1
                    if path == "boomerang":
                        for name, dur in server_timing(headers).items():
                            stages.setdefault(name, []).append(dur)
                messages.append({"role": "assistant", "content": text})
                # Let the previous turn's ReportTurn land before the next plan, as an agent's
                # tool call would; every path waits the same.
                await asyncio.sleep(job["think_seconds"])

    await _wait_until(job["start_at"])
    end = time.perf_counter() + job["duration"]
    try:
        await asyncio.gather(*(conversation_loop(p, s) for p in job["paths"] for s in range(job["slots"])))
    finally:
        await http.aclose()
    return {
        "times_ms": {p: array("d", v).tobytes() for p, v in times.items()},
        "ends_ms": {p: array("d", v).tobytes() for p, v in ends.items()},
        "stages_ms": {k: array("d", v).tobytes() for k, v in stages.items()},
        "plans": dict(plans),
        "hook_plans": dict(hook_plans),
        "reused": dict(reused),
        "errors": dict(errors),
        "turns": dict(done),
    }
