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
- `turns`: chat turns through the gateway, the naive proxy and directly (`turns.py`).
"""

from __future__ import annotations

import asyncio
import itertools
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
import uvloop
from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boomerang_tools.bench.preload import block_ids_json
from boomerang_tools.bench.turns import turns_job
from boomerang_tools.bench.workload import BLOCK_SIZE, MODEL, chain_for, conversation, next_prompt

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
        "turns": lambda job: _turns(job, index),
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


async def _turns(job: Job, index: int) -> dict[str, Any]:
    return await turns_job(job, index)


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
            resp = await client.plan_turn(requests[i], timeout=job.get("timeout", 2.0))
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
            block_groups=[tpb.BlockIdGroup(block_ids=g) for g in block_ids_json(grown)],
            num_tokens=grown.num_tokens,
            token_chain=chainproto.to_proto(chain),
            model=MODEL, request_id=uuid.uuid4().hex,
        ))
    await _wait_until(job["start_at"])
    end = time.perf_counter() + job["duration"]
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    cursor = iter(range(len(requests)))

    batch = int(job.get("batch", 1))

    async def client_loop() -> None:
        for i in cursor:
            if time.perf_counter() >= end:
                return
            t0 = time.perf_counter()
            if batch > 1:  # as a batching sender (the hook's outbox) does: one call, many turns
                items = [requests[i], *(requests[j] for j in itertools.islice(cursor, batch - 1))]
                try:
                    resp = await client.register_retained_blocks_batch(
                        rpb.RegisterRetainedBlocksBatchRequest(registrations=items), timeout=10.0)
                    for r in resp.results:
                        key = f"error_{r.error_reason}" if r.error_code else ("created" if r.response.created else "repeated")
                        outcomes[key] += 1
                except BoomerangClientError as err:
                    outcomes[f"error_{err.code}_{err.reason}"] += len(items)
                latencies.append((time.perf_counter() - t0) * 1000)
                continue
            try:
                resp = await client.register_retained_blocks(requests[i], timeout=10.0)
                outcomes["created" if resp.created else "repeated"] += 1
            except BoomerangClientError as err:
                outcomes[f"error_{err.code}_{err.reason}"] += 1
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
