"""The router's planner against a real registry process and the real Postgres.

The router runs in-process (so its pool, store and audit writer can be inspected); the
registry runs as `boomerang registry`. Every test uses its own model name, tenant and
conversation, so engines and leases of other tests never qualify.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from boomerang.clients.registry import RegistryClient
from boomerang.errors import BoomerangError, Code
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_router import rpc_surface
from boomerang_router.domain import PlanDecision, PlanReason, Retention
from boomerang_router.plan_store import PlanRecord
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.server import build_pool, build_router
from boomerang_router.settings import RouterSettings
from boomerang_server.db import make_engine
from boomerang_server.enginepool import RegistryRefresher, Role

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


class Harness:
    """An in-process Router wired to the registry process and the test database."""

    def __init__(self, database_url: str, registry_address: str, **overrides: Any):
        self.settings = RouterSettings(
            database_url=database_url,
            registry_address=registry_address,
            claim_deadline_ms=overrides.pop("claim_deadline_ms", 2000),
            heartbeat_timeout_seconds=overrides.pop("heartbeat_timeout_seconds", 0),
            **overrides,
        )
        self.db = make_engine(database_url, 4)
        self.repo = TurnPlanRepository(self.db)
        # No timed flushes: a row is in turn_plans because its answer waited for it.
        self.audit = AuditWriter(self.repo, flush_interval=60)
        self.client = RegistryClient(registry_address)
        self.pool = build_pool(self.settings)
        self.refresher = RegistryRefresher(self.pool, self.client)
        self.router = build_router(self.settings, self.client, self.pool, self.audit, self.repo, name="test-router")

    async def start(self) -> Harness:
        self.audit.start()
        assert await self.refresher.refresh()
        return self

    async def close(self) -> None:
        await self.router.drain(2.0)
        await self.audit.stop()
        await self.client.close()
        await self.db.dispose()

    async def plan(self, tenant: str, conv: str, model: str, tokens: list[int], **kw: Any) -> PlanRecord:
        req = rtpb.PlanTurnRequest(tenant=tenant, conversation_id=conv, model=model, prompt_token_ids=tokens, **kw)
        return await self.router.plan_turn(rpc_surface.plan_turn(req, 10**6))

    async def report(self, plan: PlanRecord, **kw: Any):  # type: ignore[no-untyped-def]
        req = rtpb.ReportTurnRequest(tenant=plan.tenant, plan_id=plan.plan_id, **kw)
        return await self.router.report_turn(rpc_surface.report_turn(req, 10**6))


@pytest.fixture
async def harness(database_url: str, registry_proc: ServiceProcess) -> AsyncIterator[Harness]:
    h = Harness(database_url, registry_proc.address)
    yield h
    await h.close()


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def d_handle(engine_id: str, num_tokens: int, generation: int = 1, request_id: str = "", base: int = 100) -> str:
    """D's returned kv_transfer_params at the end of a turn, as vLLM sends it."""
    return json.dumps(
        {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_block_ids": [list(range(base, base + -(-num_tokens // BS)))],
            "remote_engine_id": engine_id,
            "remote_request_id": request_id or f"cmpl-{uuid.uuid4().hex}",
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": num_tokens,
            "remote_registration_generation": generation,
            "transfer_mode": "pull",
        }
    )


async def add_engines(registry: RegistryClient, model: str, unique: str, ttl: int = 480, generation: int = 1) -> str:
    """One prefill and one decode engine for `model`; returns the decode engine's id."""
    for role, eid, port in ((tpb.ENGINE_ROLE_PREFILL, f"p-{unique}", 8100), (tpb.ENGINE_ROLE_DECODE, f"d-{unique}", 8200)):
        await registry.register_engine(
            rpb.RegisterEngineRequest(
                engine=tpb.Engine(
                    engine_id=eid, role=role, model=model, side_channel_host="127.0.0.1", side_channel_port=5600,
                    http_base_url=f"http://127.0.0.1:{port}", registration_generation=generation,
                    kv_blocks_ttl_seconds=ttl, block_size=BS,
                )
            )
        )
    return f"d-{unique}"


async def first_turn(h: Harness, registry: RegistryClient, unique: str, n_prompt: int = 300, n_out: int = 60, **kw: Any):  # type: ignore[no-untyped-def]
    """Engines, a COLD first turn, and its report; returns (model, conversation, history, decode id)."""
    model, conv = f"m-{unique}", f"conv-{unique}"
    decode = await add_engines(registry, model, unique, **kw)
    await h.start()
    prompt, out = tokens(n_prompt, 1), tokens(n_out, 2)
    plan = await h.plan("acme", conv, model, prompt)
    assert (plan.decision, plan.reason) == (PlanDecision.COLD, PlanReason.NO_LEASE)
    rep = await h.report(
        plan, decode_kv_transfer_params_json=d_handle(decode, n_prompt + n_out), prompt_token_ids=prompt, output_token_ids=out
    )
    assert rep.retention is Retention.REGISTERED and rep.lease is not None
    return model, conv, prompt + out, decode


async def test_full_turn_cycle_cold_then_pull_then_consumed(harness: Harness, registry: RegistryClient, pg: asyncpg.Connection, unique: str) -> None:
    model, conv, history, decode = await first_turn(harness, registry, unique)
    prompt2 = history + tokens(50, 3)  # 410 tokens: 360 held, verified to the last whole block
    plan = await harness.plan("acme", conv, model, prompt2)
    assert (plan.decision, plan.reason) == (PlanDecision.PULL, PlanReason.VERIFIED_PREFIX)
    assert plan.verified_tokens == 352 and plan.reusable_tokens == 352 and plan.recompute_tokens == 58
    assert plan.source_engine_id == decode and plan.lease_id and plan.claim_id == plan.plan_id
    assert plan.params is not None and plan.params.remote_num_tokens == 352
    assert plan.params.remote_block_ids == (tuple(range(100, 100 + 22)),)
    # The plan's row was written before its answer: a router killed now loses no audit.
    row = await pg.fetchrow("SELECT * FROM turn_plans WHERE plan_id = $1", uuid.UUID(plan.plan_id))
    assert row["decision"] == "PULL" and row["reported_at"] is None and str(row["lease_id"]) == plan.lease_id
    handle = d_handle(decode, 470, base=500)
    rep = await harness.report(
        plan, handle_use=rtpb.HANDLE_USE_READ, decode_kv_transfer_params_json=handle,
        prompt_token_ids=prompt2, output_token_ids=tokens(60, 4),
    )
    assert rep.claimed_lease_state == "CONSUMED" and rep.retention is Retention.REGISTERED
    assert rep.record.outcome == "REUSED"
    row = await pg.fetchrow("SELECT * FROM turn_plans WHERE plan_id = $1", uuid.UUID(plan.plan_id))
    assert row["tenant"] == "acme" and row["conversation_id"] == conv and row["decision"] == "PULL"
    assert row["reason"] == "VERIFIED_PREFIX" and row["reused_tokens"] == 352 and row["recomputed_tokens"] == 58
    assert str(row["lease_id"]) == plan.lease_id and row["claim_id"] == plan.claim_id
    assert row["prefill_engine_id"] == f"p-{unique}" and row["decode_engine_id"] == decode
    assert row["reported_at"] is not None and row["outcome"] == "REUSED" and row["claimed_lease_state"] == "CONSUMED"
    assert str(row["new_lease_id"]) == rep.lease.lease_id and row["retention"] == "REGISTERED"
    assert row["created_at"] <= row["reported_at"]
    # Repeating the report changes nothing and answers the same.
    again = await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ, decode_kv_transfer_params_json=handle,
                                 prompt_token_ids=prompt2, output_token_ids=tokens(60, 4))
    assert again.claimed_lease_state == "CONSUMED" and again.retention is Retention.ALREADY_REGISTERED
    assert again.lease is not None and again.lease.lease_id == rep.lease.lease_id
    with pytest.raises(BoomerangError) as err:
        await harness.report(plan, handle_use=rtpb.HANDLE_USE_NOT_READ)
    assert err.value.reason == "PLAN_ALREADY_REPORTED"


async def test_a_started_turns_plan_claims_nothing_and_says_what_it_missed(
    harness: Harness, registry: RegistryClient, pg: asyncpg.Connection, unique: str
) -> None:
    """A turn the live-lease summary ruled out went on without its plan; the plan beside it
    claims nothing. An earlier turn's lease it would have pulled is reported as missed, and the
    turn's own lease (registered while the plan was on its way) is not."""
    model, conv, history, _decode = await first_turn(harness, registry, unique)
    # The first turn's own plan, made after its lease was registered: nothing missed.
    own = await harness.plan("acme", conv, model, history[:300], turn_started=True)
    assert (own.decision, own.reason, own.verified_tokens) == (PlanDecision.COLD, PlanReason.NO_LEASE, 0)
    prompt2 = history + tokens(50, 3)
    started = await harness.plan("acme", conv, model, prompt2, turn_started=True)
    assert (started.decision, started.reason) == (PlanDecision.RECOMPUTE, PlanReason.TURN_STARTED)
    assert started.verified_tokens == 352 and started.reusable_tokens == 0 and not started.lease_id
    assert await pg.fetchval("SELECT count(*) FROM leases WHERE conversation_id = $1 AND state = 'RETAINED'", conv) == 1
    # So the turn that follows still pulls.
    plan = await harness.plan("acme", conv, model, prompt2)
    assert plan.decision is PlanDecision.PULL and plan.reusable_tokens == 352
    await harness.audit.flush()
    row = await pg.fetchrow("SELECT decision, reason, lease_id FROM turn_plans WHERE plan_id = $1",
                            uuid.UUID(started.plan_id))
    assert (row["decision"], row["reason"], row["lease_id"]) == ("RECOMPUTE", "TURN_STARTED", None)


async def test_delivered_reuse_is_recorded_beside_the_planned(harness: Harness, registry: RegistryClient, pg: asyncpg.Connection, unique: str) -> None:
    model, conv, history, _decode = await first_turn(harness, registry, unique)
    prompt2 = history + tokens(50, 3)
    plan = await harness.plan("acme", conv, model, prompt2)
    assert plan.decision is PlanDecision.PULL and plan.reusable_tokens == 352
    # The prefill engine pulled only part of it (say, it declined the tail's blocks).
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    names = ("boomerang_router_reuse_delivered_tokens_total", "boomerang_router_reuse_delivered_planned_tokens_total",
             "boomerang_router_reuse_shortfall_turns_total")
    before = [sample(n) for n in names]
    rep = await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ, delivered_cached_tokens=200)
    assert rep.record.delivered_cached_tokens == 200
    assert [sample(n) - b for n, b in zip(names, before)] == [200, 352, 1]
    await harness.audit.flush()
    row = await pg.fetchrow("SELECT reused_tokens, delivered_cached_tokens FROM turn_plans WHERE plan_id = $1",
                            uuid.UUID(plan.plan_id))
    assert (row["reused_tokens"], row["delivered_cached_tokens"]) == (352, 200)
    # A repeated report (with or without the count) keeps it and counts nothing twice;
    # GetTurnPlan's view has it.
    await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ, delivered_cached_tokens=200)
    await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ)
    assert [sample(n) - b for n, b in zip(names, before)] == [200, 352, 1]
    await harness.audit.flush()
    assert await pg.fetchval("SELECT delivered_cached_tokens FROM turn_plans WHERE plan_id = $1",
                             uuid.UUID(plan.plan_id)) == 200
    from boomerang_router.rpc_surface import turn_plan

    view = turn_plan(await harness.router.find_plan("acme", plan.plan_id, plan.created_at))
    assert view.HasField("delivered_cached_tokens") and view.delivered_cached_tokens == 200
    # The COLD first turn reported no count: NULL, and unset in the view.
    first = await pg.fetchrow("SELECT plan_id, delivered_cached_tokens FROM turn_plans WHERE conversation_id = $1 "
                              "AND decision = 'COLD'", conv)
    assert first["delivered_cached_tokens"] is None
    with pytest.raises(BoomerangError) as err:
        rpc_surface.report_turn(rtpb.ReportTurnRequest(tenant="acme", plan_id=plan.plan_id, delivered_cached_tokens=-1), 10**6)
    assert [v.field for v in err.value.violations] == ["delivered_cached_tokens"]


async def test_history_edited_midway_reuses_only_the_verified_prefix(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    edited = list(history)
    edited[100] = edited[100] + 1  # block 6 differs: blocks 0..5 (96 tokens) still match
    plan = await harness.plan("acme", conv, model, edited + tokens(40, 5))
    assert (plan.decision, plan.reason) == (PlanDecision.PULL, PlanReason.VERIFIED_PREFIX)
    assert plan.verified_tokens == 96 and plan.reusable_tokens == 96
    await harness.report(plan, handle_use=rtpb.HANDLE_USE_NOT_READ)  # give it back for the next case
    early = list(history)
    early[40] += 1  # only 2 blocks (32 tokens) match: below the threshold of 64
    plan = await harness.plan("acme", conv, model, early)
    assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD)
    assert plan.verified_tokens == 32 and plan.reusable_tokens == 0 and plan.params is not None
    assert plan.params.remote_engine_id is None
    rewritten = list(history)
    rewritten[3] += 1  # the first block differs: nothing is shared
    plan = await harness.plan("acme", conv, model, rewritten)
    assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.PREFIX_MISMATCH)


async def test_no_conversation_and_other_tenants(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, decode = await first_turn(harness, registry, unique)
    # Without an id the prompt finds the lease it continues (issue 23), and the turn's own
    # blocks are registered to be found the same way.
    anon = await harness.plan("acme", "", model, history + tokens(20, 9))
    assert (anon.decision, anon.reason) == (PlanDecision.PULL, PlanReason.VERIFIED_PREFIX)
    rep = await harness.report(anon, decode_kv_transfer_params_json=d_handle(decode, 100), prompt_token_ids=history[:100])
    assert rep.retention is Retention.REGISTERED
    stranger = await harness.plan("acme", "", model, tokens(300, 77))
    assert (stranger.decision, stranger.reason) == (PlanDecision.COLD, PlanReason.NO_LEASE)
    other = await harness.plan("other-tenant", conv, model, history + [1, 2, 3])
    assert (other.decision, other.reason) == (PlanDecision.COLD, PlanReason.NO_LEASE)


async def test_unknown_model_has_no_engines(harness: Harness, registry: RegistryClient, unique: str) -> None:
    await add_engines(registry, f"m-{unique}", unique)
    await harness.start()
    with pytest.raises(BoomerangError) as err:
        await harness.plan("acme", "c", f"m-{unique}-unknown", [1, 2, 3])
    assert err.value.code is Code.UNAVAILABLE and err.value.reason == "NO_PREFILL_ENGINE"


async def test_fifty_concurrent_plans_pull_exactly_once(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    prompt = history + tokens(30, 6)
    plans = await asyncio.gather(*(harness.plan("acme", conv, model, prompt) for _ in range(50)))
    pulls = [p for p in plans if p.decision is PlanDecision.PULL]
    assert len(pulls) == 1
    others = {(p.decision, p.reason) for p in plans if p.decision is not PlanDecision.PULL}
    assert others == {(PlanDecision.RECOMPUTE, PlanReason.ALREADY_CLAIMED)}
    assert len({p.plan_id for p in plans}) == 50


async def test_not_read_gives_the_handle_back_for_the_next_turn(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    prompt = history + tokens(20, 7)
    first = await harness.plan("acme", conv, model, prompt)
    second = await harness.plan("acme", conv, model, prompt)
    assert first.decision is PlanDecision.PULL and second.reason is PlanReason.ALREADY_CLAIMED
    rep = await harness.report(first, handle_use=rtpb.HANDLE_USE_NOT_READ)
    assert rep.claimed_lease_state == "RETAINED" and rep.record.outcome == "RELEASED"
    third = await harness.plan("acme", conv, model, prompt)
    assert third.decision is PlanDecision.PULL and third.lease_id == first.lease_id


async def test_expiring_lease_is_not_pulled(harness: Harness, registry: RegistryClient, unique: str) -> None:
    # TTL 15 s minus the registry's 10 s margin leaves 5 s: less than the 10 s the router asks for.
    model, conv, history, _ = await first_turn(harness, registry, unique, ttl=15)
    plan = await harness.plan("acme", conv, model, history + [7] * 20)
    assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.EXPIRING)


async def test_block_size_mismatch(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    chain = build_chain(history + [9] * 10, 32)
    req = rtpb.PlanTurnRequest(
        tenant="acme", conversation_id=conv, model=model,
        prompt_chain=tpb.TokenChain(block_size=32, num_tokens=chain.num_tokens, block_hashes=chain.block_hashes, tail_hash=chain.tail_hash),
    )
    plan = await harness.router.plan_turn(rpc_surface.plan_turn(req, 10**6))
    assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.BLOCK_SIZE_MISMATCH)


async def test_dead_engine_in_registry_is_engine_unavailable(harness: Harness, registry: RegistryClient, pg: asyncpg.Connection, unique: str) -> None:
    model, conv, history, decode = await first_turn(harness, registry, unique)
    # The engine is marked dead before its leases are invalidated (the reaper's two steps).
    await pg.execute("UPDATE engines SET status = 'DEAD' WHERE engine_id = $1", decode)
    plan = await harness.plan("acme", conv, model, history + [5] * 20)
    assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE)
    await harness.refresher.refresh()
    assert harness.pool.choose(model, Role.DECODE) is None  # and it left the pool


async def test_stale_heartbeat_in_the_routers_view_gives_the_claim_back(database_url: str, registry_proc: ServiceProcess,
                                                                         registry: RegistryClient, unique: str) -> None:
    h = Harness(database_url, registry_proc.address, heartbeat_timeout_seconds=1.0)
    try:
        model, conv, history, _decode = await first_turn(h, registry, unique)
        # A second decode engine keeps heartbeating; the lease's engine goes quiet.
        other = f"d2-{unique}"
        await registry.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
            engine_id=other, role=tpb.ENGINE_ROLE_DECODE, model=model, side_channel_host="127.0.0.1", side_channel_port=5601,
            http_base_url="http://127.0.0.1:8201", registration_generation=1, block_size=BS)))
        for _ in range(3):
            await asyncio.sleep(0.6)
            for eid in (f"p-{unique}", other):
                await registry.heartbeat(rpb.HeartbeatRequest(engine_id=eid, registration_generation=1))
            await h.refresher.refresh()
        plan = await h.plan("acme", conv, model, history + [5] * 20)
        assert (plan.decision, plan.reason) == (PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE)
        assert plan.decode_engine_id == other
        await h.router.drain(5.0)  # the background release
        conv_state = await registry.get_conversation(rpb.GetConversationRequest(tenant="acme", conversation_id=conv, include_events=True))
        assert conv_state.leases[0].state == tpb.LEASE_STATE_RETAINED
        assert "ROUTER_ENGINE_UNAVAILABLE" in [e.reason for e in conv_state.events]
    finally:
        await h.close()


async def test_generation_change_registers_the_engine_and_ends_old_handles(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, decode = await first_turn(harness, registry, unique)
    # D restarted at generation 2 and returns a handle the registry has not seen.
    prompt = history + tokens(40, 8)
    plan = await harness.plan("acme", conv, model, prompt)
    assert plan.decision is PlanDecision.PULL
    out = tokens(30, 9)
    rep = await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ, decode_kv_transfer_params_json=d_handle(decode, len(prompt) + 30, generation=2),
                               prompt_token_ids=prompt, output_token_ids=out)
    assert rep.retention is Retention.REGISTERED and rep.lease is not None and rep.lease.engine_generation == 2
    engines = await registry.list_engines(rpb.ListEnginesRequest(model=model, role=tpb.ENGINE_ROLE_DECODE))
    assert [e.registration_generation for e in engines.engines] == [2]
    await harness.refresher.refresh()
    nxt = await harness.plan("acme", conv, model, prompt + out + [1] * 20)
    assert nxt.decision is PlanDecision.PULL and nxt.params is not None and nxt.params.remote_registration_generation == 2
    # A late report carrying the old generation's handle is refused, not registered.
    stale = await harness.report(nxt, handle_use=rtpb.HANDLE_USE_READ, decode_kv_transfer_params_json=d_handle(decode, 50, generation=1),
                                 prompt_token_ids=prompt[:50])
    assert stale.retention is Retention.REJECTED and stale.detail == "STALE_GENERATION"


async def test_unknown_decode_engine_is_registered_from_its_handle(harness: Harness, registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    newcomer = f"d-new-{unique}"
    plan = await harness.plan("acme", conv, model, history + [3] * 30)
    rep = await harness.report(plan, handle_use=rtpb.HANDLE_USE_READ, decode_kv_transfer_params_json=d_handle(newcomer, 200, generation=7),
                               prompt_token_ids=history[:200])
    assert rep.retention is Retention.REGISTERED and rep.lease is not None and rep.lease.engine_id == newcomer
    engines = await registry.list_engines(rpb.ListEnginesRequest(model=model, role=tpb.ENGINE_ROLE_DECODE))
    new = next(e for e in engines.engines if e.engine_id == newcomer)
    assert new.registration_generation == 7 and new.http_base_url == plan.decode_url and new.side_channel_port == 5600


async def test_request_id_makes_plans_idempotent_across_routers(harness: Harness, database_url: str, registry_proc: ServiceProcess,
                                                                 registry: RegistryClient, unique: str) -> None:
    model, conv, history, _ = await first_turn(harness, registry, unique)
    prompt = history + [4] * 20
    a = await harness.plan("acme", conv, model, prompt, request_id="req-1")
    b = await harness.plan("acme", conv, model, prompt, request_id="req-1")
    assert b is a and a.decision is PlanDecision.PULL
    replica = await Harness(database_url, registry_proc.address).start()
    try:
        c = await replica.plan("acme", conv, model, prompt, request_id="req-1")
        assert c.decision is PlanDecision.PULL and c.lease_id == a.lease_id and c.claim_id == a.claim_id
        assert c.plan_id != a.plan_id
        # The other replica finds this replica's plan once its audit row is written.
        await harness.audit.flush()
        found = await replica.router.find_plan("acme", a.plan_id, a.created_at)
        assert found.lease_id == a.lease_id and found.decision is PlanDecision.PULL
        with pytest.raises(BoomerangError) as err:
            await replica.router.find_plan("someone-else", a.plan_id, a.created_at)
        assert err.value.code is Code.NOT_FOUND
        rep = await replica.report(a, handle_use=rtpb.HANDLE_USE_READ)
        assert rep.claimed_lease_state == "CONSUMED"
        await harness.report(a, handle_use=rtpb.HANDLE_USE_READ)
        with pytest.raises(BoomerangError) as err:  # the handle is spent: a late retry gets no copy of it
            await harness.plan("acme", conv, model, prompt, request_id="req-1")
        assert err.value.reason == "PLAN_ALREADY_REPORTED"
    finally:
        await replica.close()


async def test_a_prefill_on_d_runs_on_the_engine_holding_the_history_and_gives_the_claim_back(
    harness: Harness, registry: RegistryClient, pg: asyncpg.Connection, unique: str
) -> None:
    model, conv, history, decode = await first_turn(harness, registry, unique)
    prompt2 = history + tokens(50, 3)
    # The hook cannot send a turn to D: without can_prefill_on_decode the plan never says so.
    plan = await harness.plan("acme", conv, model, prompt2, request_id=f"a-{unique}")
    assert plan.decision is PlanDecision.PULL
    await harness.report(plan, handle_use=rtpb.HANDLE_USE_NOT_READ)
    plan = await harness.plan("acme", conv, model, prompt2, can_prefill_on_decode=True)
    assert (plan.decision, plan.reason) == (PlanDecision.PREFILL_ON_DECODE, PlanReason.VERIFIED_PREFIX)
    assert plan.decode_engine_id == decode and plan.reusable_tokens == 352 and plan.recompute_tokens == 58
    assert not plan.lease_id and plan.params is not None and plan.params.remote_engine_id is None
    from boomerang_router.rpc_surface import plan_response

    response = plan_response(plan)
    assert response.decision == rtpb.PLAN_DECISION_PREFILL_ON_DECODE
    await harness.router.drain(2.0)  # the claim goes back in the background
    again = await harness.plan("acme", conv, model, prompt2)  # so the next turn can pull it
    assert again.decision is PlanDecision.PULL and again.source_engine_id == decode
    rep = await harness.report(plan, prefill_seconds=0.05, inter_token_seconds=0.02)
    assert rep.record.outcome == "COMPUTED"
    await harness.audit.flush()
    assert await pg.fetchval("SELECT decision FROM turn_plans WHERE plan_id = $1", uuid.UUID(plan.plan_id)) == (
        "PREFILL_ON_DECODE")


async def test_no_prefill_on_d_when_its_bound_is_zero(database_url: str, registry_proc: ServiceProcess,
                                                      registry: RegistryClient, unique: str) -> None:
    h = Harness(database_url, registry_proc.address, decode_prefill_itl_bound=0)
    try:
        model, conv, history, _ = await first_turn(h, registry, unique)
        plan = await h.plan("acme", conv, model, history + tokens(50, 3), can_prefill_on_decode=True)
        assert plan.decision is PlanDecision.PULL
    finally:
        await h.close()


async def test_reported_times_teach_the_router_that_the_link_is_slow(database_url: str, registry_proc: ServiceProcess,
                                                                     registry: RegistryClient, unique: str) -> None:
    from boomerang_router.rpc_surface import pool_engine

    h = Harness(database_url, registry_proc.address, ttft_learning_turns=30)
    try:
        model, conv, history, decode = await first_turn(h, registry, unique)
        prefill = f"p-{unique}"
        decisions = []
        for turn in range(6):
            prompt = history + tokens(50, 10 + turn)
            plan = await h.plan("acme", conv, model, prompt, prefill_engine_id=prefill)
            assert plan.prefill_engine_id == prefill
            decisions.append(plan.decision)
            out = tokens(40, 20 + turn)
            # The pulls take 2 s (a link far slower than the default's 55 GB/s); a recompute 80 ms.
            seconds = 2.0 if plan.decision is PlanDecision.PULL else 0.08
            await h.report(plan, handle_use=rtpb.HANDLE_USE_READ, prefill_seconds=seconds,
                           delivered_cached_tokens=plan.reusable_tokens,
                           decode_kv_transfer_params_json=d_handle(decode, len(prompt) + 40, base=100 + 50 * turn),
                           prompt_token_ids=prompt, output_token_ids=out)
            history = prompt + out
        assert decisions[0] is PlanDecision.PULL and decisions[-1] is PlanDecision.RECOMPUTE, decisions
        assert decisions.index(PlanDecision.RECOMPUTE) <= 3, decisions
        entries = {e.info.engine_id: pool_engine(e, h.router.models) for e in h.pool.entries(model)}
        learned = entries[prefill]
        assert learned.prefill_cost.observations >= 1
        [copy] = learned.copy_costs
        assert copy.source_engine_id == decode and copy.observations >= 2 and copy.token_ms > 0.05
        unknown = await h.plan("acme", f"{conv}-x", model, tokens(20, 99), prefill_engine_id="no-such-engine")
        assert unknown.prefill_engine_id == prefill  # an engine not in the pool: the router's own choice
    finally:
        await h.close()
