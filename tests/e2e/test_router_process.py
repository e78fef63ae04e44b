"""`boomerang router` and `boomerang registry` as real processes over gRPC on the real Postgres."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import asyncpg
import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.procs import BOOMERANG, ServiceProcess
from tests.support.router_stack import running_registry, running_router

pytestmark = pytest.mark.e2e
BS = 16


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
    with running_router(database_url, registry.address) as proc:
        yield proc


@pytest.fixture
async def rc(registry: ServiceProcess) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(registry.address) as c:
        yield c


@pytest.fixture
async def client(router: ServiceProcess) -> AsyncIterator[RouterClient]:
    async with RouterClient(router.address, plan_timeout=5.0) as c:
        yield c


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def add_engine(rc: RegistryClient, engine_id: str, role: int, model: str, port: int = 8000) -> None:
    await rc.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
        engine_id=engine_id, role=role, model=model, side_channel_host="127.0.0.1", side_channel_port=5600,
        http_base_url=f"http://127.0.0.1:{port}", registration_generation=1, block_size=BS)))


async def pool_has(client: RouterClient, model: str, *engine_ids: str) -> None:
    async def seen() -> bool:
        pool = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))
        available = {e.engine.engine_id for e in pool.engines if e.available}
        return set(engine_ids) <= available

    await eventually(seen)


def history(n: int, seed: int) -> list[int]:
    return [(seed * 1_000_003 + i * 7919) % 150_000 for i in range(n)]


def handle(engine_id: str, num_tokens: int, base: int = 100) -> dict[str, Any]:
    return {
        "do_remote_decode": True, "do_remote_prefill": False,
        "remote_block_ids": [list(range(base, base + -(-num_tokens // BS)))],
        "remote_engine_id": engine_id, "remote_request_id": f"cmpl-{uuid.uuid4().hex}",
        "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
        "remote_num_tokens": num_tokens, "remote_registration_generation": 1, "transfer_mode": "pull",
    }


async def setup_conversation(client: RouterClient, rc: RegistryClient, unique: str) -> tuple[str, str, list[int], str]:
    """Engines and a first turn reported; returns (model, conversation, history, decode id)."""
    model, conv, decode = f"m-{unique}", f"c-{unique}", f"d-{unique}"
    await add_engine(rc, f"p-{unique}", tpb.ENGINE_ROLE_PREFILL, model, 8100)
    await add_engine(rc, decode, tpb.ENGINE_ROLE_DECODE, model, 8200)
    await pool_has(client, model, f"p-{unique}", decode)
    prompt, out = history(400, 1), history(80, 2)
    first = await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=prompt))
    assert (first.decision, first.reason) == (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_NO_LEASE)
    assert json.loads(first.kv_transfer_params_json) == {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None,
    }
    rep = await client.report_turn(rtpb.ReportTurnRequest(
        tenant="acme", plan_id=first.plan_id, decode_kv_transfer_params_json=json.dumps(handle(decode, 480)),
        prompt_token_ids=prompt, output_token_ids=out))
    assert rep.retention == rtpb.RETENTION_OUTCOME_REGISTERED and rep.lease.num_tokens == 480
    return model, conv, prompt + out, decode


async def test_health_and_reflection(router: ServiceProcess) -> None:
    async with grpc.aio.insecure_channel(router.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "boomerang.v1.RouterService"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_turns_over_grpc_pull_exactly_what_was_verified(client: RouterClient, rc: RegistryClient,
                                                             pg: asyncpg.Connection, unique: str) -> None:
    model, conv, hist, decode = await setup_conversation(client, rc, unique)
    prompt = hist + history(37, 3)
    plan = await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=prompt))
    assert (plan.decision, plan.reason) == (rtpb.PLAN_DECISION_PULL, rtpb.PLAN_REASON_VERIFIED_PREFIX)
    params = json.loads(plan.kv_transfer_params_json)
    assert params["remote_num_tokens"] == plan.reusable_tokens == 480 and plan.recompute_tokens == len(prompt) - 480
    assert params["remote_engine_id"] == decode == plan.source_engine_id and params["transfer_mode"] == "pull"
    assert params["remote_block_ids"] == [list(range(100, 130))] and params["do_remote_decode"] is True
    assert plan.kv_transfer_params.remote_num_tokens == 480 and plan.prefill_engine.http_base_url == "http://127.0.0.1:8100"
    rep = await client.report_turn(rtpb.ReportTurnRequest(tenant="acme", plan_id=plan.plan_id, handle_use=rtpb.HANDLE_USE_READ))
    assert rep.claimed_lease_state == tpb.LEASE_STATE_CONSUMED
    got = await client.get_turn_plan(rtpb.GetTurnPlanRequest(tenant="acme", plan_id=plan.plan_id))
    assert got.plan.outcome == "REUSED" and got.plan.reusable_tokens == 480 and got.plan.HasField("report_time")

    async def recorded() -> bool:
        row = await pg.fetchrow("SELECT decision, outcome, reused_tokens FROM turn_plans WHERE plan_id = $1", uuid.UUID(plan.plan_id))
        return row is not None and tuple(row) == ("PULL", "REUSED", 480)

    await eventually(recorded)
    with pytest.raises(BoomerangClientError) as err:
        await client.get_turn_plan(rtpb.GetTurnPlanRequest(tenant="someone-else", plan_id=plan.plan_id))
    assert err.value.code == "NOT_FOUND"


async def test_bad_requests_name_the_field_and_record_nothing(client: RouterClient, pg: asyncpg.Connection, unique: str) -> None:
    before = await pg.fetchval("SELECT count(*) FROM turn_plans")
    with pytest.raises(BoomerangClientError) as err:
        await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=f"c-{unique}", model=""))
    assert err.value.code == "INVALID_ARGUMENT"
    assert {v.field for v in err.value.error.violations} == {"model", "prompt_token_ids"}
    with pytest.raises(BoomerangClientError) as err:
        await client.report_turn(rtpb.ReportTurnRequest(tenant="acme", plan_id="nope", decode_kv_transfer_params_json="{"))
    assert {v.field for v in err.value.error.violations} == {"plan_id", "decode_kv_transfer_params_json"}
    with pytest.raises(BoomerangClientError) as err:
        await client.report_turn(rtpb.ReportTurnRequest(tenant="acme", plan_id="01900000-0000-7000-8000-000000000000"))
    assert (err.value.code, err.value.reason) == ("NOT_FOUND", "PLAN_NOT_FOUND")
    with pytest.raises(BoomerangClientError) as err:
        await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", model=f"no-engines-{unique}", prompt_token_ids=[1]))
    assert (err.value.code, err.value.reason) == ("UNAVAILABLE", "NO_PREFILL_ENGINE")
    await asyncio.sleep(0.3)
    assert await pg.fetchval("SELECT count(*) FROM turn_plans") == before


async def test_fifty_concurrent_plans_over_grpc_pull_exactly_once(client: RouterClient, rc: RegistryClient, unique: str) -> None:
    model, conv, hist, _ = await setup_conversation(client, rc, unique)
    req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=hist + [5] * 40)
    plans = await asyncio.gather(*(client.plan_turn(req) for _ in range(50)))
    decisions = [p.decision for p in plans]
    assert decisions.count(rtpb.PLAN_DECISION_PULL) == 1
    assert {p.reason for p in plans if p.decision != rtpb.PLAN_DECISION_PULL} == {rtpb.PLAN_REASON_ALREADY_CLAIMED}


async def test_engine_death_leaves_the_pool_and_ends_its_handles(client: RouterClient, rc: RegistryClient, unique: str) -> None:
    model, conv, hist, decode = await setup_conversation(client, rc, unique)
    spare = f"d2-{unique}"
    await add_engine(rc, spare, tpb.ENGINE_ROLE_DECODE, model, 8201)
    await pool_has(client, model, spare)
    await rc.invalidate_engine(rpb.InvalidateEngineRequest(engine_id=decode, reason="HEARTBEAT_TIMEOUT"))

    async def dead() -> bool:
        pool = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model, role=tpb.ENGINE_ROLE_DECODE))
        by_id = {e.engine.engine_id: e for e in pool.engines}
        return not by_id[decode].available and by_id[decode].unavailable_reason == "DEAD" and by_id[spare].available

    await eventually(dead)
    for _ in range(3):
        plan = await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=hist + [9] * 20))
        assert plan.decode_engine.engine_id == spare
        assert (plan.decision, plan.reason) == (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_NO_LEASE)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_static_engines_and_a_stopped_registry(database_url: str, http_engine: str, pg: asyncpg.Connection,
                                                      unique: str) -> None:
    """Static pool with health checks; then the registry dies: plans stay on time, degraded.

    The degraded plans are short prompts, whose claims have the 50 ms claim deadline: that
    they answer within it is the point. The plans with the registry up are long prompts, whose
    claims may wait what their reuse is worth (claim_wait_share 1: 1 s here), so a busy
    machine's slow first claim does not turn them into degraded ones too."""
    reg_port = free_port()
    registry = ServiceProcess(["registry", "--listen", f"127.0.0.1:{reg_port}"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    down = f"http://127.0.0.1:{free_port()}"
    router = ServiceProcess(
        ["router", "--listen", "127.0.0.1:0", "--registry", registry.address, "--claim-deadline-ms", "50",
         "--prefill", f"p={http_engine}", "--decode", f"d-up={http_engine}", "--decode", f"d-down={down}",
         "--health-check-seconds", "0.2"],
        {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_BREAKER_COOLDOWN_SECONDS": "0.5",
         "BOOMERANG_CLAIM_WAIT_SHARE": "1"},
    ).start()
    try:
        async with RouterClient(router.address, plan_timeout=5.0) as client:
            async def down_left() -> bool:
                pool = await client.list_engines(rtpb.RouterServiceListEnginesRequest())
                by_id = {e.engine.engine_id: e for e in pool.engines}
                return by_id["d-down"].unavailable_reason == "HEALTH_CHECK_FAILED" and by_id["d-up"].available

            await eventually(down_left)
            req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=f"c-{unique}", model="any", prompt_token_ids=list(range(200)))
            # 50k tokens × 0.02061 ms (the default prefill cost) × share 1: past the 1 s cap.
            long_req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=f"c-{unique}", model="any",
                                            prompt_token_ids=[i % 150_000 for i in range(50_000)])
            healthy = await client.plan_turn(long_req)
            assert (healthy.decision, healthy.reason) == (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_NO_LEASE)
            assert healthy.decode_engine.engine_id == "d-up" and healthy.prefill_engine.http_base_url == http_engine

            registry.kill()
            degraded = []
            for _ in range(8):
                start = time.perf_counter()
                plan = await client.plan_turn(req)
                took = time.perf_counter() - start
                assert (plan.decision, plan.reason) == (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_CONTROL_PLANE_DEGRADED)
                assert took < 1.0, took
                assert json.loads(plan.kv_transfer_params_json)["remote_engine_id"] is None
                degraded.append(uuid.UUID(plan.plan_id))

            async def recorded() -> bool:
                return await pg.fetchval("SELECT count(*) FROM turn_plans WHERE plan_id = ANY($1)", degraded) == 8

            await eventually(recorded)
            # The router's own time per plan (claim attempt included) stayed within the deadline.
            slowest = await pg.fetchval("SELECT max(plan_micros) FROM turn_plans WHERE plan_id = ANY($1)", degraded)
            assert slowest < 50_000 + 50_000, slowest

            registry = ServiceProcess(["registry", "--listen", f"127.0.0.1:{reg_port}"], {"BOOMERANG_DATABASE_URL": database_url}).start()

            async def recovered() -> bool:  # polls until the new registry answers (its start)
                return (await client.plan_turn(long_req)).reason == rtpb.PLAN_REASON_NO_LEASE

            await eventually(recovered, timeout=15)
        assert router.terminate() == 0
    finally:
        router.kill()
        registry.kill()


async def test_required_auth_refuses_anonymous_callers(database_url: str, registry: ServiceProcess, unique: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    router = ServiceProcess(
        ["router", "--listen", "127.0.0.1:0", "--registry", registry.address],
        {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"},
    ).start()
    try:
        req = rtpb.RouterServiceListEnginesRequest()
        async with RouterClient(router.address) as anonymous:
            with pytest.raises(BoomerangClientError) as err:
                await anonymous.list_engines(req)
            assert (err.value.code, err.value.reason) == ("UNAUTHENTICATED", "NO_CREDENTIALS")
        out = subprocess.run([BOOMERANG, "credentials", "create", f"service:gw-{unique}", "--database-url", database_url],
                             capture_output=True, text=True, check=True)
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", out.stdout.split()[1])
        async with RouterClient(router.address) as gateway:
            await gateway.list_engines(req)
    finally:
        router.kill()


async def test_finished_turns_keep_an_engine_that_never_heartbeats_in_the_pool(
    database_url: str, registry: ServiceProcess, rc: RegistryClient, unique: str
) -> None:
    """Real vLLM without the hook never heartbeats; the router vouches for it after each turn."""
    timeout = 1.5
    proc = ServiceProcess(
        ["router", "--listen", "127.0.0.1:0", "--registry", registry.address, "--engine-refresh-seconds", "0.1",
         "--claim-deadline-ms", "2000", "--heartbeat-timeout-seconds", str(timeout)],
        {"BOOMERANG_DATABASE_URL": database_url},
    ).start()
    model, silent = f"m-{unique}", f"vllm-{unique}"  # `silent`: known only from its handles
    await add_engine(rc, f"p-{unique}", tpb.ENGINE_ROLE_PREFILL, model, 8100)
    await add_engine(rc, f"d-{unique}", tpb.ENGINE_ROLE_DECODE, model, 8200)

    async def keep_alive() -> None:  # the engines the plans choose heartbeat themselves
        while True:
            for engine_id in (f"p-{unique}", f"d-{unique}"):
                await rc.heartbeat(rpb.HeartbeatRequest(engine_id=engine_id, registration_generation=1))
            await asyncio.sleep(0.3)

    beating = asyncio.create_task(keep_alive())
    try:
        async with RouterClient(proc.address, plan_timeout=5.0) as client:
            await pool_has(client, model, f"p-{unique}", f"d-{unique}")

            async def turn(conv: str, prompt: list[int]) -> rtpb.PlanTurnResponse:
                plan = await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model,
                                                                   prompt_token_ids=prompt))
                rep = await client.report_turn(rtpb.ReportTurnRequest(
                    tenant="acme", plan_id=plan.plan_id, decode_kv_transfer_params_json=json.dumps(handle(silent, len(prompt) + 16)),
                    prompt_token_ids=prompt, output_token_ids=history(16, 9)))
                assert rep.retention in (rtpb.RETENTION_OUTCOME_REGISTERED, rtpb.RETENTION_OUTCOME_ALREADY_REGISTERED)
                return plan

            first = history(400, 3)
            await turn(f"c0-{unique}", first)  # registers `silent` from its handle
            # Other conversations' turns finish on `silent` for longer than the timeout...
            for i in range(1, 8):
                await asyncio.sleep(0.4)
                await turn(f"c{i}-{unique}", history(200, 10 + i))
            # ...so it is still alive to the router, and the first conversation pulls from it.
            again = await client.plan_turn(rtpb.PlanTurnRequest(
                tenant="acme", conversation_id=f"c0-{unique}", model=model, prompt_token_ids=first + history(16, 9) + [5] * 40))
            assert again.decision == rtpb.PLAN_DECISION_PULL, again
            assert json.loads(again.kv_transfer_params_json)["remote_engine_id"] == silent
    finally:
        beating.cancel()
        proc.kill()
