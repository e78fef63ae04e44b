"""Two replicas of every service on one Postgres; one of each SIGKILLed mid-run; nothing lost.

Registry, router, reaper and gateway run twice (`a` and `b`, each chain a → a, b → b) on one
database, with one simulated prefill/decode pair. Each conversation alternates gateways turn
by turn, so a PULL proves the replicas share every lease through Postgres alone. Then
registry, router, reaper and gateway `a` are SIGKILLed together; every later turn goes to
`b` and still succeeds and PULLs (the leases were committed before each turn ended), the
standby reaper takes the lead, and every planned turn has its plan in `turn_plans` once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import httpx
import pytest
from boomerang.clients.reaper import ReaperClient

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL
from tests.support.procs import ServiceProcess, wait_for

pytestmark = pytest.mark.e2e
CONVERSATIONS = 8
REPLICAS = ("a", "b")


class Replicas:
    """The processes, by name (`registry-a`, `gateway-b`, `sim-decode`, …)."""

    def __init__(self, url: str):
        self.url = url
        self.env = {"BOOMERANG_DATABASE_URL": url, "BOOMERANG_MIGRATE_ON_START": "false",
                    "BOOMERANG_DRAIN_DELAY_SECONDS": "0", "BOOMERANG_GRACE_SECONDS": "3",
                    "BOOMERANG_CLAIM_DEADLINE_MS": "2000", "BOOMERANG_PLAN_TIMEOUT_SECONDS": "3",
                    "BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2", "BOOMERANG_DB_POOL_SIZE": "3"}
        self.procs: dict[str, ServiceProcess] = {}

    def start(self, name: str, args: list[str]) -> ServiceProcess:
        self.procs[name] = ServiceProcess(args, self.env, name=name).start()
        return self.procs[name]

    def addr(self, name: str) -> str:
        return self.procs[name].address

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.kill()


@pytest.fixture
def replicas() -> Iterator[Replicas]:
    with fresh_database() as url:
        r = Replicas(url)
        try:
            for x in REPLICAS:
                r.start(f"registry-{x}", ["registry", "--listen", "127.0.0.1:0"])
            run = uuid.uuid4().hex[:6]
            for role in ("prefill", "decode"):
                r.start(f"sim-{role}", ["sim", "--role", role, "--port", "0", "--engine-id", f"rep-{role}-{run}",
                                        "--registry", r.addr("registry-a"), "--heartbeat-seconds", "0.5",
                                        "--time-scale", "0"])
            for x in REPLICAS:
                registry = r.addr(f"registry-{x}")
                r.start(f"reaper-{x}", ["reaper", "--listen", "127.0.0.1:0", "--registry", registry,
                                        "--replica-id", f"reaper-{x}"])
                r.start(f"router-{x}", ["router", "--listen", "127.0.0.1:0", "--registry", registry,
                                        "--engine-refresh-seconds", "0.2"])
                r.start(f"gateway-{x}", ["gateway", "--listen", "127.0.0.1:0", "--router", r.addr(f"router-{x}"),
                                         "--registry", registry, "--allow-anonymous"])
            for x in REPLICAS:
                url_x = f"http://{r.addr(f'gateway-{x}')}/health"
                assert wait_for(lambda u=url_x: httpx.get(u, timeout=2).json().get("models", 0) >= 1, 30), x
            yield r
        finally:
            r.stop()


async def _leader(proc: ServiceProcess) -> str:
    async with ReaperClient(proc.address, timeout=2) as client:
        status = await client.get_status()
    return status.replica_id if status.leader else status.leader_replica_id


async def test_two_of_every_service_one_of_each_killed_nothing_lost(replicas: Replicas) -> None:
    histories = [[{"role": "system", "content": f"Agent {n}. " + "Read, edit, test. " * 40}]
                 for n in range(CONVERSATIONS)]
    ids = [f"rep-{n}-{uuid.uuid4().hex[:6]}" for n in range(CONVERSATIONS)]
    results: list[tuple[str, str, int, str]] = []  # phase, gateway, status, plan
    plan_ids: list[str] = []
    ruled_out: list[int] = []  # turns the live-lease summary started at once: their plan id comes later
    alive = list(REPLICAS)

    async def step(http: httpx.AsyncClient, phase: str, turn: int) -> None:
        async def one(n: int) -> None:
            gateway = alive[(n + turn) % len(alive)]
            histories[n].append({"role": "user", "content": f"Turn {turn}: " + "open the next file. " * 10})
            resp = await http.post(f"http://{replicas.addr(f'gateway-{gateway}')}/v1/chat/completions",
                                   json={"model": MODEL, "messages": histories[n], "max_tokens": 16,
                                         "conversation_id": ids[n]})
            body: dict[str, Any] = resp.json()
            results.append((phase, gateway, resp.status_code, resp.headers.get("x-boomerang-plan", "")))
            assert resp.status_code == 200, (phase, gateway, body)
            if resp.headers.get("x-boomerang-plan-id"):
                plan_ids.append(resp.headers["x-boomerang-plan-id"])
            elif resp.headers.get("x-boomerang-reason") == "NO_LIVE_LEASE":
                ruled_out.append(turn)
            histories[n].append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

        await asyncio.gather(*(one(n) for n in range(CONVERSATIONS)))

    async with httpx.AsyncClient(timeout=60) as http:
        for turn in range(3):
            await step(http, "both", turn)
        both = [r for r in results if r[0] == "both"]
        assert {g for _, g, _, _ in both} == set(REPLICAS)
        assert [p for _, _, _, p in both[CONVERSATIONS:]].count("PULL") == 2 * CONVERSATIONS, both
        for x in REPLICAS:  # every lease committed before its turn's last byte
            assert "ended before its report was answered" not in replicas.procs[f"gateway-{x}"].output()

        assert await _leader(replicas.procs["reaper-b"]) == "reaper-a"
        # Killed at once: every answered plan's audit row is written already.
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda n: replicas.procs[f"{n}-a"].kill(), ("gateway", "router", "reaper", "registry")))
        alive.remove("a")

        for turn in range(3, 6):
            await step(http, "b-only", turn)
    after = [r for r in results if r[0] == "b-only"]
    assert {g for _, g, _, _ in after} == {"b"} and all(s == 200 for _, _, s, _ in results)
    assert [p for _, _, _, p in after].count("PULL") == len(after), after

    # The standby reaper leads once the dead leader's lease lapses (10 s).
    for _ in range(60):
        if await _leader(replicas.procs["reaper-b"]) == "reaper-b":
            break
        await asyncio.sleep(0.5)
    assert await _leader(replicas.procs["reaper-b"]) == "reaper-b"

    conn = await asyncpg.connect(replicas.url)
    try:
        rows = await conn.fetch("SELECT plan_id::text AS id, count(*) AS n, max(router) AS router FROM turn_plans "
                                "WHERE plan_id = ANY($1::uuid[]) GROUP BY plan_id", plan_ids)
        assert len(rows) == len(plan_ids) == len(results) - len(ruled_out) and {r["n"] for r in rows} == {1}
        # Only first turns can be ruled out, and each still has its plan in the audit trail.
        assert set(ruled_out) <= {0}, ruled_out
        audited = await conn.fetchval("SELECT count(*) FROM turn_plans WHERE conversation_id = ANY($1::text[])", ids)
        assert audited == len(results)
        assert len({r["router"] for r in rows}) == 2  # both routers planned, one set of rows
        leases = await conn.fetchval("SELECT count(*) FROM leases WHERE conversation_id = ANY($1) "
                                     "AND state = 'RETAINED'", ids)
        assert leases == CONVERSATIONS  # each conversation's last turn is retained, once
    finally:
        await conn.close()
    stats = httpx.get(f"http://{replicas.addr('sim-prefill')}/sim/stats", timeout=5).json()
    assert stats["corrupt_pulls"] == 0 and stats["expired_or_freed_reads"] == 0
