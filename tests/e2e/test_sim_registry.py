"""`boomerang sim --registry`: the simulator registers itself, heartbeats, and re-registers on restart."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e


async def _engine(client: RegistryClient, engine_id: str) -> tpb.Engine | None:
    listed = await client.list_engines(rpb.ListEnginesRequest())
    return next((e for e in listed.engines if e.engine_id == engine_id), None)


async def _wait_engine(client: RegistryClient, engine_id: str, generation: int, timeout: float = 10.0) -> tpb.Engine:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        e = await _engine(client, engine_id)
        if e is not None and e.registration_generation == generation:
            return e
        await asyncio.sleep(0.1)
    raise AssertionError(f"{engine_id} never reached generation {generation}")


async def test_sim_registers_heartbeats_and_reregisters_after_restart(database_url: str, unique: str) -> None:
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    engine_id = f"sim-d-{unique}"
    sim = ServiceProcess(["sim", "--role", "decode", "--port", "0", "--engine-id", engine_id, "--ttl", "90",
                          "--registry", registry.address, "--heartbeat-seconds", "0.2", "--time-scale", "0",
                          "--generation", "1"]).start()
    try:
        async with RegistryClient(registry.address, timeout=3.0) as client, httpx.AsyncClient(timeout=10) as http:
            stats = (await http.get(f"http://{sim.address}/sim/stats")).json()
            e = await _wait_engine(client, engine_id, 1)
            assert e.role == tpb.ENGINE_ROLE_DECODE and e.model == "Qwen/Qwen3-32B"
            assert f"{e.side_channel_host}:{e.side_channel_port}" == stats["side_channel"]
            assert e.http_base_url == f"http://{sim.address}"
            assert (e.kv_blocks_ttl_seconds, e.block_size, e.kv_recompute_threshold) == (90, 16, 64)
            assert e.bytes_per_block == 16 * 262144
            first_beat = e.heartbeat_time.ToDatetime()
            await asyncio.sleep(0.6)
            later = await _engine(client, engine_id)
            assert later is not None and later.heartbeat_time.ToDatetime() > first_beat

            restarted = (await http.post(f"http://{sim.address}/sim/restart")).json()
            assert restarted["registration_generation"] == 2
            await _wait_engine(client, engine_id, 2, timeout=5.0)
    finally:
        sim.kill()
        registry.kill()
    assert "Traceback" not in sim.output()


async def test_sim_moves_past_a_newer_generation_the_registry_holds(database_url: str, unique: str) -> None:
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    engine_id = f"sim-d-{unique}"
    try:
        async with RegistryClient(registry.address, timeout=3.0) as client:
            await client.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
                engine_id=engine_id, role=tpb.ENGINE_ROLE_DECODE, model="Qwen/Qwen3-32B",
                side_channel_host="127.0.0.1", side_channel_port=9, registration_generation=5)))
            sim = ServiceProcess(["sim", "--role", "decode", "--port", "0", "--engine-id", engine_id,
                                  "--registry", registry.address, "--heartbeat-seconds", "0.2",
                                  "--generation", "1"]).start()
            try:
                await _wait_engine(client, engine_id, 6)  # a restarted engine registers a newer generation
                async with httpx.AsyncClient(timeout=10) as http:
                    stats = (await http.get(f"http://{sim.address}/sim/stats")).json()
                assert stats["registration_generation"] == 6 and stats["restarts"] == 1
            finally:
                sim.kill()
    finally:
        registry.kill()


async def test_a_new_process_registers_a_newer_generation_by_default(database_url: str, unique: str) -> None:
    """Engines keep their id across restarts; the default generation must still move forward."""
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    engine_id = f"sim-p-{unique}"
    args = ["sim", "--role", "prefill", "--port", "0", "--engine-id", engine_id, "--registry", registry.address,
            "--heartbeat-seconds", "0.2"]
    try:
        async with RegistryClient(registry.address, timeout=3.0) as client, httpx.AsyncClient(timeout=10) as http:
            generations = []
            for _ in range(2):
                sim = ServiceProcess(args).start()
                try:
                    gen = (await http.get(f"http://{sim.address}/sim/stats")).json()["registration_generation"]
                    await _wait_engine(client, engine_id, gen)
                    generations.append(gen)
                finally:
                    sim.kill()
            assert generations[1] > generations[0]
    finally:
        registry.kill()
