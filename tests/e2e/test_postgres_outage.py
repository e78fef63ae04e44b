"""Postgres stopped for 30 s during traffic (issue 7).

The whole stack runs on a private PostgreSQL cluster the test starts and stops (the same
embedded cluster `boomerang up` uses), so stopping it harms no other test. While it is
down: every request still succeeds, plans answer CONTROL_PLANE_DEGRADED within their
deadline, and nothing stale or corrupt is handed out; once it is back, plans stop being
degraded within 5 s and reuse resumes. Every turn the router planned, during the outage
too, has its plan in the audit trail exactly once (issue 15: the router spools the rows
Postgres cannot take, on disk, and writes them when it is back — also after a restart).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.router import RouterClient
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.db import upgrade
from boomerang_tools.stack.postgres import EmbeddedPostgres, find_binaries

from tests.e2e.test_gateway_faults import Conversations
from tests.support.gateway_stack import MODEL, GatewayStack
from tests.support.procs import ServiceProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
OUTAGE_SECONDS = 30.0
PLAN_DEADLINE_SECONDS = 0.25
# The restarted server's log: anywhere the server's user (postgres, when the tests run as
# root) may write, which the test's own folders are not.
RESTART_LOG = "/dev/null"


@pytest.fixture
def private_postgres() -> Iterator[EmbeddedPostgres]:
    if find_binaries() is None:
        pytest.skip("no local PostgreSQL binaries to run a private cluster")
    root = Path(tempfile.mkdtemp(prefix="boomerang-outage-"))
    pg = EmbeddedPostgres(root)
    try:
        upgrade(pg.start())
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stack(private_postgres: EmbeddedPostgres) -> Iterator[GatewayStack]:
    s = GatewayStack(private_postgres.url, gateway_args=["--allow-anonymous"])
    s.env.update({
        "BOOMERANG_CLAIM_DEADLINE_MS": str(int(PLAN_DEADLINE_SECONDS * 1000)),
        "BOOMERANG_PLAN_TIMEOUT_SECONDS": "0.6",
        "BOOMERANG_CONTROL_PLANE_BACKOFF_SECONDS": "0.3",
        "BOOMERANG_AUDIT_SPOOL_DIR": str(private_postgres.root / "audit-spool"),
    })
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _pg_ctl(pg: EmbeddedPostgres, *args: str) -> None:
    pg._pg("pg_ctl", *args)


async def _audited(pg: EmbeddedPostgres, plan_ids: list[str], timeout: float = 15.0) -> dict[str, int]:
    """Rows per plan id in `turn_plans`, once every one of `plan_ids` is there (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        conn = await asyncpg.connect(pg.url)
        try:
            rows = await conn.fetch("SELECT plan_id::text AS id, count(*) AS n FROM turn_plans "
                                    "WHERE plan_id = ANY($1::uuid[]) GROUP BY plan_id", plan_ids)
        finally:
            await conn.close()
        counts = {r["id"]: r["n"] for r in rows}
        if len(counts) == len(set(plan_ids)) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.25)


async def _plan(router: str, conversation: str) -> tuple[float, rtpb.PlanTurnResponse]:
    tokens = list(range(3000))
    chain = build_chain(tokens, 16)
    req = rtpb.PlanTurnRequest(
        tenant="anonymous", conversation_id=conversation, model=MODEL, num_prompt_tokens=len(tokens),
        prompt_chain=tpb.TokenChain(block_size=16, num_tokens=chain.num_tokens, block_hashes=chain.block_hashes,
                                    tail_hash=chain.tail_hash),
    )
    started = time.perf_counter()
    async with RouterClient(router, timeout=5) as client:
        resp = await client.plan_turn(req)
    return time.perf_counter() - started, resp


async def test_postgres_down_for_thirty_seconds(private_postgres: EmbeddedPostgres, stack: GatewayStack) -> None:
    if True:
        convs = Conversations(stack.gateway_url, "anonymous-no-key")
        router = stack.procs["router"].address
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
            for _ in range(3):
                await convs.step(http, "healthy")
            assert "PULL" in convs.plans("healthy")

            port = private_postgres.port
            _pg_ctl(private_postgres, "stop", "-D", str(private_postgres.data), "-m", "fast", "-w")
            down_since = time.monotonic()
            plan_times: list[float] = []
            while time.monotonic() - down_since < OUTAGE_SECONDS:
                await convs.step(http, "outage")
                try:
                    took, resp = await _plan(router, f"probe-{uuid.uuid4().hex[:8]}")
                except BoomerangClientError as err:
                    raise AssertionError(f"PlanTurn failed during the outage: {err}\n" + stack.procs["router"].output()[-4000:]) from None
                plan_times.append(took)
                convs.plan_ids.append(resp.plan_id)
                assert resp.reason == rtpb.PLAN_REASON_CONTROL_PLANE_DEGRADED, resp
                assert resp.decision in (rtpb.PLAN_DECISION_RECOMPUTE, rtpb.PLAN_DECISION_COLD)
                await asyncio.sleep(0.5)
            assert set(convs.plans("outage")) <= {"RECOMPUTE", "COLD"}, convs.results
            # Each plan answered within its deadline plus the gRPC hop on a busy two-core box.
            assert max(plan_times) < PLAN_DEADLINE_SECONDS + 0.5, plan_times

            _pg_ctl(private_postgres, "start", "-w", "-D", str(private_postgres.data), "-l", RESTART_LOG,
                    "-o", f"-p {port}")
            back = time.monotonic()
            recovered_after = None
            while time.monotonic() - back < 15:
                try:
                    _, resp = await _plan(router, f"probe-{uuid.uuid4().hex[:8]}")
                except BoomerangClientError:
                    await asyncio.sleep(0.1)  # e.g. no engine yet: heartbeats resume with the database
                    continue
                if resp.reason != rtpb.PLAN_REASON_CONTROL_PLANE_DEGRADED:
                    recovered_after = time.monotonic() - back
                    break
                await asyncio.sleep(0.1)
            assert recovered_after is not None and recovered_after <= 5.0, recovered_after

            for _ in range(4):
                await convs.step(http, "recovered")
            assert "PULL" in convs.plans("recovered")[-len(convs.ids):], convs.results[-2 * len(convs.ids):]
        assert all(status == 200 for _, status, _, _ in convs.results)
        assert await asyncio.to_thread(stack.unsafe) == 0
        # Every planned turn, those of the outage too, is in the audit trail exactly once.
        counts = await _audited(private_postgres, convs.plan_ids)
        missing = set(convs.plan_ids) - set(counts)
        assert not missing, (len(missing), len(convs.plan_ids), stack.procs["router"].output()[-3000:])
        assert set(counts.values()) == {1}
        assert "dropped" not in stack.procs["router"].output()


async def test_a_router_stopped_during_an_outage_writes_its_spool_when_restarted(
    private_postgres: EmbeddedPostgres, stack: GatewayStack
) -> None:
    convs = Conversations(stack.gateway_url, "anonymous-no-key")
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
        await convs.step(http, "healthy")
        port = private_postgres.port
        _pg_ctl(private_postgres, "stop", "-D", str(private_postgres.data), "-m", "fast", "-w")
        before = len(convs.plan_ids)
        for _ in range(2):
            await convs.step(http, "outage")
        assert len(convs.plan_ids) > before  # the router planned turns Postgres could not record
        router = stack.procs["router"]
        assert await asyncio.to_thread(router.terminate) == 0
        spool = private_postgres.root / "audit-spool"
        assert any(spool.rglob("*.jsonl")), "the stopped router left no spool"
        _pg_ctl(private_postgres, "start", "-w", "-D", str(private_postgres.data), "-l", RESTART_LOG, "-o", f"-p {port}")
        # A new router on the same database (and spool folder) writes what the old one spooled.
        stack.procs["router"] = await asyncio.to_thread(ServiceProcess(router.args, stack.env, name="router").start)
        counts = await _audited(private_postgres, convs.plan_ids)
        assert set(counts) == set(convs.plan_ids), (len(counts), len(convs.plan_ids),
                                                    stack.procs["router"].output()[-3000:])
        assert set(counts.values()) == {1}
        for _ in range(50):
            if not any(spool.rglob("*.jsonl")):
                break
            await asyncio.sleep(0.1)
        assert not any(spool.rglob("*.jsonl")), "the replayed spool was not removed"
