"""The router when the control plane is slow or down: answers in time, loses only the reuse.

A slow Postgres is a lease row locked by another transaction (the registry's claim waits on
it); a down registry is an address nobody listens on; a failing audit database is a URL
nobody listens on. The router runs in-process against a real registry process.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import boomerang_router.claims as claims_module
import boomerang_router.settlement as settlement_module
import pytest
from boomerang.clients.registry import RegistryClient
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_router import rpc_surface
from boomerang_router.domain import PlanDecision, PlanReason
from boomerang_router.plan_store import PlanRecord
from boomerang_router.planner import Router
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.server import build_pool, build_router
from boomerang_router.settings import RouterSettings
from boomerang_server.db import make_engine
from boomerang_server.enginepool import EngineInfo, RegistryRefresher, Role
from prometheus_client import REGISTRY

from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.integration
BS = 16


@pytest.fixture(scope="module")
def registry_proc(database_url: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
async def registry(registry_proc: ServiceProcess) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(registry_proc.address) as client:
        yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_router(database_url: str, registry_address: str, audit_url: str = "", **overrides: Any) -> Router:
    settings = RouterSettings(database_url=database_url, registry_address=registry_address, heartbeat_timeout_seconds=0, **overrides)
    repo = TurnPlanRepository(make_engine(audit_url or database_url, 2))
    audit = AuditWriter(repo, flush_interval=0.02, attempts=2)
    return build_router(settings, RegistryClient(registry_address), build_pool(settings), audit, repo, name="degraded-test")


def registry_client(router: Router) -> RegistryClient:
    """The registry client the router was built over."""
    return router.reporter.registry


async def close(router: Router) -> None:
    await router.drain(1.0)
    await router.audit.stop(2.0)
    await registry_client(router).close()
    await router.repo.engine.dispose()


async def plan(router: Router, tenant: str, conv: str, model: str, tokens: list[int]) -> tuple[PlanRecord, float]:
    start = time.perf_counter()
    req = rtpb.PlanTurnRequest(tenant=tenant, conversation_id=conv, model=model, prompt_token_ids=tokens)
    record = await router.plan_turn(rpc_surface.plan_turn(req, 10**6))
    return record, time.perf_counter() - start


def static_engines(router: Router, model: str) -> None:
    router.pool.apply_registry_snapshot(
        [
            EngineInfo("p", Role.PREFILL, model=model, http_base_url="http://127.0.0.1:8100"),
            EngineInfo("d", Role.DECODE, model=model, http_base_url="http://127.0.0.1:8200", block_size=BS),
        ]
    )


async def retained_lease(registry: RegistryClient, unique: str, n: int = 320) -> tuple[str, str, list[int], str]:
    """Engines and one retained lease of `n` tokens; returns (model, conversation, tokens, lease id)."""
    model, conv, engine_id = f"m-{unique}", f"conv-{unique}", f"d-{unique}"
    for role, eid in ((tpb.ENGINE_ROLE_PREFILL, f"p-{unique}"), (tpb.ENGINE_ROLE_DECODE, engine_id)):
        await registry.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
            engine_id=eid, role=role, model=model, side_channel_host="127.0.0.1", side_channel_port=5600,
            http_base_url="http://127.0.0.1:8000", registration_generation=1, block_size=BS)))
    history = [(i * 7919) % 100_000 for i in range(n)]
    from boomerang.tokenchain import build_chain

    chain = build_chain(history, BS)
    reg = await registry.register_retained_blocks(rpb.RegisterRetainedBlocksRequest(
        tenant="acme", conversation_id=conv, engine_id=engine_id, engine_generation=1,
        remote_request_id=f"cmpl-{uuid.uuid4().hex}", block_groups=[tpb.BlockIdGroup(block_ids=list(range(n // BS)))],
        num_tokens=n, model=model,
        token_chain=tpb.TokenChain(block_size=BS, num_tokens=n, block_hashes=chain.block_hashes, tail_hash=chain.tail_hash)))
    return model, conv, history, reg.lease.lease_id


async def lease_state(registry: RegistryClient, conv: str) -> tuple[int, list[str]]:
    got = await registry.get_conversation(rpb.GetConversationRequest(tenant="acme", conversation_id=conv, include_events=True))
    return got.leases[0].state, [e.reason for e in got.events]


async def test_slow_postgres_answers_degraded_in_time_and_leaves_no_claim_behind(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, pg: asyncpg.Connection,
    unique: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(settlement_module, "ORPHAN_PROBE_DELAYS", (0.3, 0.6))
    model, conv, history, lease_id = await retained_lease(registry, unique)
    router = make_router(database_url, registry_proc.address, claim_deadline_ms=100)
    router.audit.start()
    await RegistryRefresher(router.pool, registry_client(router)).refresh()
    try:
        async with pg.transaction():
            await pg.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease_id))
            record, took = await plan(router, "acme", conv, model, history + [1] * 40)
            assert (record.decision, record.reason) == (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)
            assert took < 0.1 + 0.25, took
            assert "DEADLINE_EXCEEDED" in record.outcome_detail
            assert record.params is not None and record.params.remote_engine_id is None
        # Whether the registry's claim was cancelled with the call or committed late and was
        # found by the orphan probe, nothing stays claimed: the next turn pulls.
        await router.drain(5.0)
        state, _ = await lease_state(registry, conv)
        assert state == tpb.LEASE_STATE_RETAINED
        again, _ = await plan(router, "acme", conv, model, history + [1] * 40)
        assert again.decision is PlanDecision.PULL and again.lease_id == lease_id
    finally:
        await close(router)


async def test_a_plan_answers_within_its_callers_deadline_when_the_claim_hangs(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, pg: asyncpg.Connection,
    unique: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim deadline (here 5 s) is not the caller's: a caller with 0.3 s left gets its
    (degraded) answer inside those 0.3 s, whatever the registry and its database do."""
    monkeypatch.setattr(settlement_module, "ORPHAN_PROBE_DELAYS", (0.3, 0.6))
    model, conv, history, lease_id = await retained_lease(registry, unique)
    router = make_router(database_url, registry_proc.address, claim_deadline_ms=5000)
    router.audit.start()
    await RegistryRefresher(router.pool, registry_client(router)).refresh()
    try:
        async with pg.transaction():
            await pg.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease_id))
            req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model,
                                       prompt_token_ids=history + [1] * 40)
            start = time.perf_counter()
            record = await router.plan_turn(rpc_surface.plan_turn(req, 10**6), caller_seconds=0.3)
            took = time.perf_counter() - start
            assert (record.decision, record.reason) == (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)
            assert took < 0.3, took
        await router.drain(5.0)
        again, _ = await plan(router, "acme", conv, model, history + [1] * 40)
        assert again.decision is PlanDecision.PULL and again.lease_id == lease_id
    finally:
        await close(router)


async def test_the_vllm_hooks_default_deadline_leaves_time_for_the_claim(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prefill hook plans with 20 ms (`plan_deadline_ms`'s default). A fixed 20 ms reply
    margin left no time for the claim, so every plan of a default hook degraded; a short
    deadline now keeps half of it for the reply and gives the claim the rest.

    What is measured is the claim's budget, on a stopped claim clock: how long the machine
    takes to reach the claim is not this test's (it made a busy machine miss the ~10 ms). The
    claim itself then runs with room, so the plan shows that the budget reaches a real claim."""
    from boomerang_vllm_hook.config import BoomerangHookConfig

    hook_deadline = BoomerangHookConfig.model_fields["plan_deadline_ms"].default / 1000
    model, conv, history, lease_id = await retained_lease(registry, unique)
    router = make_router(database_url, registry_proc.address)
    router.audit.start()
    monkeypatch.setattr(claims_module, "time", _StoppedMonotonic())
    budgets: list[float] = []
    claim = router.claimer.batcher.claim_in_batch

    async def roomy_claim(req: Any, timeout: float, patient: bool = False) -> Any:
        budgets.append(timeout)
        return await claim(req, 10.0, patient)

    monkeypatch.setattr(router.claimer.batcher, "claim_in_batch", roomy_claim)
    try:
        await RegistryRefresher(router.pool, registry_client(router)).refresh()
        req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=history + [1] * 40)
        record = await router.plan_turn(rpc_surface.plan_turn(req, 10**6), caller_seconds=hook_deadline)
        assert router.stats["claims_skipped_caller_deadline"] == 0  # the claim was asked...
        assert budgets == [pytest.approx(hook_deadline / 2)]  # ...with half the deadline (the reply keeps the rest)
        assert (record.decision, record.lease_id) == (PlanDecision.PULL, lease_id), record.outcome_detail
    finally:
        await close(router)


class _StoppedMonotonic:
    """The `time` module as the plan's claim step sees it, with `monotonic` stopped: a deadline's
    budget is then exactly what the claim step computes from it, however slow the machine."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def monotonic() -> float:
        return 1000.0


@pytest.mark.parametrize(("tokens", "outcome"), [(320, PlanDecision.COLD), (40_000, PlanDecision.PULL)])
async def test_a_slow_claim_degrades_a_short_prompt_and_serves_a_long_one(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, pg: asyncpg.Connection,
    unique: str, tokens: int, outcome: PlanDecision, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry answers the claim 80 ms late (its lease row locked). A short prompt's
    plan gives up at the 50 ms claim deadline and recomputes; a 40k-token prompt's claim may
    wait a quarter of the ~824 ms of prefill it could save, within the caller's 0.25 s less
    the reply margin (200 ms), so it gets the lease."""
    monkeypatch.setattr(settlement_module, "ORPHAN_PROBE_DELAYS", (0.3,))
    model, conv, history, lease_id = await retained_lease(registry, unique, n=tokens)
    router = make_router(database_url, registry_proc.address, claim_deadline_ms=50)
    router.audit.start()
    await RegistryRefresher(router.pool, registry_client(router)).refresh()
    req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=history + [1] * 40)
    try:
        async with pg.transaction():
            await pg.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease_id))
            planned = asyncio.ensure_future(router.plan_turn(rpc_surface.plan_turn(req, 10**6), caller_seconds=0.25))
            await asyncio.sleep(0.08)
        record = await planned
        assert record.decision is outcome, (record.reason, record.outcome_detail)
        if outcome is PlanDecision.PULL:
            assert record.lease_id == lease_id
        else:
            assert record.reason is PlanReason.CONTROL_PLANE_DEGRADED
        await router.drain(5.0)
    finally:
        await close(router)


async def test_orphan_probe_releases_a_claim_whose_answer_was_lost(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settlement_module, "ORPHAN_PROBE_DELAYS", (0.05,))
    model, conv, history, _lease_id = await retained_lease(registry, unique)
    from boomerang.tokenchain import build_chain

    chain = build_chain(history + [1] * 40, BS)
    claim = rpb.ClaimReuseRequest(
        tenant="acme", conversation_id=conv, model=model, claim_id=f"lost-{unique}", min_reusable_tokens=64,
        min_remaining_seconds=10,
        prompt_chain=tpb.TokenChain(block_size=BS, num_tokens=chain.num_tokens, block_hashes=chain.block_hashes, tail_hash=chain.tail_hash),
    )
    got = await registry.claim_reuse(claim)  # committed, but (say) the answer never reached the router
    assert got.outcome == rpb.CLAIM_OUTCOME_CLAIMED
    router = make_router(database_url, registry_proc.address)
    try:
        await router.claims.orphan_probe(claim)
        state, reasons = await lease_state(registry, conv)
        assert state == tpb.LEASE_STATE_RETAINED and "ROUTER_CLAIM_TIMED_OUT" in reasons
        assert router.stats["orphan_claims_found"] == 1
        # A probe never takes a lease itself: probing again finds nothing and claims nothing.
        await router.claims.orphan_probe(claim)
        assert (await lease_state(registry, conv))[0] == tpb.LEASE_STATE_RETAINED
    finally:
        await close(router)


async def test_orphan_probe_leaves_a_claim_that_a_retry_was_handed(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim id of a request id is shared by its retries: a retry may hold it; never release it then."""
    monkeypatch.setattr(settlement_module, "ORPHAN_PROBE_DELAYS", (0.05,))
    model, conv, history, lease_id = await retained_lease(registry, unique)
    prompt = history + [1] * 40
    first, retry = (make_router(database_url, registry_proc.address) for _ in range(2))
    for r in (first, retry):
        r.audit.start()
        await RegistryRefresher(r.pool, registry_client(r)).refresh()
    try:
        # The retry (on another replica) gets the claim and hands it out...
        req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=prompt, request_id=f"r-{unique}")
        handed = await retry.plan_turn(rpc_surface.plan_turn(req, 10**6))
        assert handed.decision is PlanDecision.PULL and handed.lease_id == lease_id
        from boomerang.tokenchain import build_chain

        chain = build_chain(prompt, BS)
        lost = rpb.ClaimReuseRequest(
            tenant="acme", conversation_id=conv, model=model, claim_id=handed.claim_id, min_reusable_tokens=64,
            prompt_chain=tpb.TokenChain(block_size=BS, num_tokens=chain.num_tokens, block_hashes=chain.block_hashes, tail_hash=chain.tail_hash),
        )
        # ...so neither the replica that holds it in memory nor the one that timed out releases it.
        await retry.claims.orphan_probe(lost)
        assert retry.stats["orphan_claims_in_use"] == 1
        await retry.audit.flush()
        await first.claims.orphan_probe(lost)
        assert first.stats["orphan_claims_in_use"] == 1 and first.stats["orphan_claims_found"] == 0
        assert (await lease_state(registry, conv))[0] == tpb.LEASE_STATE_CLAIMED
    finally:
        await close(first)
        await close(retry)


async def test_registry_down_answers_degraded_and_the_breaker_stops_asking(database_url: str, unique: str) -> None:
    router = make_router(database_url, f"127.0.0.1:{free_port()}", claim_deadline_ms=50, breaker_failures=2,
                         breaker_cooldown_seconds=60)
    router.audit.start()
    static_engines(router, "m")
    try:
        timings = []
        for i in range(5):
            record, took = await plan(router, "acme", f"c-{unique}", "m", list(range(100 + i)))
            assert (record.decision, record.reason) == (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)
            assert record.prefill_engine_id == "p" and record.decode_engine_id == "d"
            timings.append(took)
        assert max(timings) < 0.05 + 0.25, timings
        assert router.claimer.breaker.is_open and router.stats["claims_skipped_breaker_open"] == 3
        assert max(timings[2:]) < 0.02, timings  # no registry call at all while open
        # Reports need the registry: they fail UNAVAILABLE for the caller to retry.
        with pytest.raises(BoomerangError) as err:
            pid = (await plan(router, "acme", f"c-{unique}", "m", [1, 2, 3]))[0].plan_id
            handle = {"do_remote_decode": True, "remote_block_ids": [[1]], "remote_engine_id": "d", "remote_request_id": "r",
                      "remote_host": "h", "remote_port": 1, "remote_num_tokens": 3}
            await router.report_turn(rpc_surface.report_turn(rtpb.ReportTurnRequest(
                tenant="acme", plan_id=pid, decode_kv_transfer_params_json=json.dumps(handle), prompt_token_ids=[1, 2, 3]), 100))
        assert err.value.code is Code.UNAVAILABLE and err.value.reason == "REGISTRY_UNAVAILABLE"
    finally:
        await close(router)


def unanswered() -> dict[str, float]:
    """boomerang_router_claims_unanswered_total by `why`, from this process's registry."""
    return {s.labels["why"]: s.value for m in REGISTRY.collect() if m.name == "boomerang_router_claims_unanswered"
            for s in m.samples if s.name.endswith("_total")}


async def test_the_breaker_counts_failed_calls_not_the_claims_in_them(database_url: str, unique: str) -> None:
    """Eight claims at once leave in two calls (one alone, then a batch of seven); both fail.
    That is two failures in a row, not eight: the breaker (three) stays closed, and opens
    only when a third call fails."""
    router = make_router(database_url, f"127.0.0.1:{free_port()}", claim_deadline_ms=200, breaker_failures=3,
                         breaker_cooldown_seconds=60, claim_batches_in_flight=1)
    router.audit.start()
    static_engines(router, "m")
    before = unanswered()
    try:
        records = await asyncio.gather(*(plan(router, "acme", f"c-{unique}-{i}", "m", list(range(100))) for i in range(8)))
        assert {(r.decision, r.reason) for r, _ in records} == {(PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)}
        failed = {k: v for k, v in router.stats.items() if k.startswith("claims_failed_")}
        assert sum(failed.values()) == 8, failed  # UNAVAILABLE, then DEADLINE_EXCEEDED while the channel backs off
        assert not router.claimer.breaker.is_open
        await plan(router, "acme", f"c-{unique}-x", "m", list(range(100)))
        assert router.claimer.breaker.is_open
        await plan(router, "acme", f"c-{unique}-y", "m", list(range(100)))
        # The metric operators see says the same, and names the breaker for the plan it skipped.
        counted = {k: v - before.get(k, 0) for k, v in unanswered().items() if v > before.get(k, 0)}
        assert counted == {**{k.removeprefix("claims_failed_"): v for k, v in router.stats.items()
                              if k.startswith("claims_failed_")}, "breaker_open": 1}, counted
    finally:
        await close(router)


async def test_audit_failures_never_fail_a_plan(database_url: str, registry_proc: ServiceProcess, unique: str) -> None:
    dead_db = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    router = make_router(database_url, registry_proc.address, audit_url=dead_db)
    router.audit.start()
    static_engines(router, "m")
    try:
        for i in range(3):
            record, _ = await plan(router, "acme", f"c-{unique}", "m", list(range(50 + i)))
            assert record.decision is PlanDecision.COLD and record.reason is PlanReason.NO_LEASE
        deadline = time.monotonic() + 15
        while router.audit.dropped < 3:
            assert time.monotonic() < deadline, router.audit.dropped
            await asyncio.sleep(0.05)
        assert router.audit.written == 0
    finally:
        await close(router)


async def test_caller_that_gives_up_mid_claim_gets_its_claim_released(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, pg: asyncpg.Connection, unique: str
) -> None:
    model, conv, history, lease_id = await retained_lease(registry, unique)
    router = make_router(database_url, registry_proc.address, claim_deadline_ms=5000)
    router.audit.start()
    await RegistryRefresher(router.pool, registry_client(router)).refresh()
    try:
        async with pg.transaction():
            await pg.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease_id))
            caller = asyncio.ensure_future(plan(router, "acme", conv, model, history + [2] * 40))
            await asyncio.sleep(0.3)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
        deadline = time.monotonic() + 10
        while router.stats["claims_released_caller_gone"] == 0 or router.claims.tasks:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        state, reasons = await lease_state(registry, conv)
        assert state == tpb.LEASE_STATE_RETAINED and "ROUTER_CALLER_GONE" in reasons
        await router.audit.flush()
        row = await pg.fetchrow("SELECT decision, outcome FROM turn_plans WHERE tenant = 'acme' AND conversation_id = $1", conv)
        assert (row["decision"], row["outcome"]) == ("PULL", "ABANDONED")
    finally:
        await close(router)


async def test_a_degraded_plan_is_not_replayed_to_a_retry(
    database_url: str, registry_proc: ServiceProcess, registry: RegistryClient, pg: asyncpg.Connection, unique: str
) -> None:
    model, conv, history, lease_id = await retained_lease(registry, unique)
    router = make_router(database_url, registry_proc.address, claim_deadline_ms=100)
    router.audit.start()
    await RegistryRefresher(router.pool, registry_client(router)).refresh()
    req = rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model, prompt_token_ids=history + [3] * 40,
                               request_id=f"r-{unique}")
    try:
        async with pg.transaction():
            await pg.execute("SELECT 1 FROM leases WHERE lease_id = $1 FOR UPDATE", uuid.UUID(lease_id))
            first = await router.plan_turn(rpc_surface.plan_turn(req, 10**6))
        assert first.reason is PlanReason.CONTROL_PLANE_DEGRADED
        retry = await router.plan_turn(rpc_surface.plan_turn(req, 10**6))
        assert retry.plan_id != first.plan_id and retry.decision is PlanDecision.PULL and retry.lease_id == lease_id
        assert await router.plan_turn(rpc_surface.plan_turn(req, 10**6)) is retry  # a real answer is replayed
    finally:
        await close(router)
