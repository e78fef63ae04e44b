"""Graceful drain of every gRPC service: on SIGTERM it reports NOT_SERVING, keeps serving
through its drain delay, finishes in-flight calls, and exits 0; no client request fails."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import grpc
import pytest
from boomerang.clients.reaper import ReaperClient
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.procs import ServiceProcess
from tests.support.registry_data import engine_request

pytestmark = pytest.mark.e2e


async def drain_while_busy(proc: ServiceProcess, service: str, call: Callable[[], Awaitable[object]]) -> None:
    """SIGTERM `proc` with calls in flight and more arriving during the drain delay."""
    assert proc.proc is not None
    seen_not_serving = False
    async with grpc.aio.insecure_channel(proc.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        before = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert before.status == health_pb2.HealthCheckResponse.SERVING
        first = [asyncio.create_task(call()) for _ in range(20)]
        await asyncio.sleep(0.01)
        proc.proc.send_signal(signal.SIGTERM)
        later = []
        for _ in range(10):  # during the drain delay: health says NOT_SERVING, calls still land
            await asyncio.sleep(0.05)
            try:
                status = (await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)).status
                seen_not_serving |= status == health_pb2.HealthCheckResponse.NOT_SERVING
            except grpc.aio.AioRpcError:
                break
            later.append(asyncio.create_task(call()))
        results = await asyncio.gather(*first, *later, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == [], failures[:3]
    assert seen_not_serving, "the service never reported NOT_SERVING while draining"
    code = await asyncio.to_thread(proc.proc.wait, 30)
    proc.kill()
    assert code == 0, proc.output()


async def test_registry_router_and_reaper_drain(database_url: str, unique: str) -> None:
    env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_DRAIN_DELAY_SECONDS": "1", "BOOMERANG_GRACE_SECONDS": "10"}
    registry = await asyncio.to_thread(ServiceProcess(["registry", "--listen", "127.0.0.1:0"], env).start)
    router = await asyncio.to_thread(
        ServiceProcess(["router", "--listen", "127.0.0.1:0", "--registry", registry.address], env).start)
    reaper = await asyncio.to_thread(
        ServiceProcess(["reaper", "--listen", "127.0.0.1:0", "--registry", registry.address], env).start)
    try:
        async with RegistryClient(registry.address) as reg:
            await reg.register_engine(engine_request(f"p-{unique}", role=1, model=f"m-{unique}"))
            await reg.register_engine(engine_request(f"d-{unique}", model=f"m-{unique}"))

        async with RouterClient(router.address, timeout=10) as client:
            async def plan() -> object:
                return await client.plan_turn(rtpb.PlanTurnRequest(
                    tenant="drain", conversation_id=f"c-{unique}", model=f"m-{unique}",
                    prompt_token_ids=list(range(200)), num_prompt_tokens=200))

            for _ in range(50):  # the router's pool learns the engines from the registry
                try:
                    await plan()
                    break
                except Exception:  # noqa: BLE001
                    await asyncio.sleep(0.2)
            await drain_while_busy(router, "boomerang.v1.RouterService", plan)

        async with ReaperClient(reaper.address, timeout=10) as client:
            await drain_while_busy(reaper, "boomerang.v1.TTLReaperService",
                                   lambda: client.get_status())

        async with RegistryClient(registry.address, timeout=10) as client:
            await drain_while_busy(registry, "boomerang.v1.BlockRegistryService",
                                   lambda: client.list_engines(rpb.ListEnginesRequest()))
    finally:
        for proc in (reaper, router, registry):
            proc.kill()
