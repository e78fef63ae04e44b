"""The gateway end to end with a client that sends no conversation id (issue 23).

Registry, router, simulated engines and gateway as real processes. Without an id, each
later turn must PULL the lease of its own previous turn (found by the prompt it continues),
never another conversation's, even when all of them share a long system prompt; a fork
pulls once; another tenant recomputes; stripped reasoning pulls the verified prefix; a
first turn that only starts like a live lease is COLD and leaves that lease alone; another
`cache_salt` (vLLM's isolation key) is COLD as another tenant is.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import openai
import pytest

from tests.support.gateway_stack import MODEL, THINKING, GatewayStack, running_stack

pytestmark = pytest.mark.e2e
# About 4k tokens with the simulated tokenizer, shared by every conversation.
SYSTEM = "You are a careful coding agent; read the code before you change it and run the tests. " * 220


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with running_stack() as s:
        yield s


@pytest.fixture(scope="module")
def key(stack: GatewayStack) -> str:
    return stack.new_key("noid")


async def chat(c: openai.AsyncOpenAI, messages: list[dict[str, Any]], model: str = MODEL,
               max_tokens: int = 24, cache_salt: str | None = None) -> tuple[str, dict[str, str], int]:
    """One turn with no conversation id: the reply, the Boomerang headers, the prompt's tokens."""
    extra = {"cache_salt": cache_salt} if cache_salt is not None else None
    raw = await c.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=max_tokens,
                                                            extra_body=extra)
    done = raw.parse()
    assert done.usage is not None
    headers = {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-boomerang")}
    return done.choices[0].message.content or "", headers, done.usage.prompt_tokens


def user(conv: int, step: int) -> dict[str, str]:
    return {"role": "user", "content": f"Conversation {conv}, step {step}: open file {conv * 7 + step} and check it."}


async def plan_rows(stack: GatewayStack, plan_ids: list[str]) -> dict[str, asyncpg.Record]:
    """The plans' rows once every one is reported (the router writes them in the background)."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        deadline = time.monotonic() + 20
        while True:
            rows = await conn.fetch(
                "SELECT plan_id::text AS plan_id, lease_id::text AS lease_id, new_lease_id::text AS new_lease_id,"
                " decision FROM turn_plans WHERE plan_id = ANY($1::uuid[]) AND reported_at IS NOT NULL", plan_ids)
            if len(rows) == len(plan_ids) or time.monotonic() > deadline:
                return {r["plan_id"]: r for r in rows}
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def registered_by_cold_plans(stack: GatewayStack, lease_ids: set[str]) -> bool:
    """Whether every one of the leases was registered by the report of a COLD plan."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        found = await conn.fetchval("SELECT count(*) FROM turn_plans WHERE new_lease_id = ANY($1::uuid[]) "
                                    "AND decision = 'COLD'", list(lease_ids))
    finally:
        await conn.close()
    return bool(found == len(lease_ids))


async def test_64_interleaved_conversations_on_a_shared_system_prompt_pull_their_own_leases(
    stack: GatewayStack, key: str
) -> None:
    n, turns = 64, 3
    histories: list[list[dict[str, Any]]] = [[{"role": "system", "content": SYSTEM}] for _ in range(n)]
    plan_ids: list[list[str]] = [[] for _ in range(n)]
    decisions: list[list[str]] = [[] for _ in range(n)]
    before = stack.stats()
    gate = asyncio.Semaphore(16)  # interleaved, at a load the two-core test box serves in time
    order = list(range(n))
    async with stack.openai_client(key) as c:
        for step in range(turns):
            async def one(k: int, step: int = step) -> None:
                histories[k].append(user(k, step))
                async with gate:
                    reply, headers, prompt_tokens = await chat(c, histories[k])
                histories[k].append({"role": "assistant", "content": reply})
                plan_ids[k].append(headers.get("x-boomerang-plan-id", ""))
                decisions[k].append(f'{headers["x-boomerang-plan"]}/{headers["x-boomerang-reason"]}')
                if step == 0:
                    assert prompt_tokens > 4000
            random.Random(step).shuffle(order)
            await asyncio.gather(*(one(k) for k in order))
    assert all(d[0].startswith("COLD/") and all(x.startswith("PULL/") for x in d[1:]) for d in decisions), decisions
    # A first turn started at once (no assistant message: nothing to continue), its plan made
    # beside it, so the client has no plan id for it.
    assert all(ids[0] == "" for ids in plan_ids)
    rows = await plan_rows(stack, [p for ids in plan_ids for p in ids[1:]])
    # Each second turn pulled a lease of its own: 64 different ones, each a first turn's
    # (the registry verified each against the prompt, which continues one first turn only).
    firsts = {rows[ids[1]]["lease_id"] for ids in plan_ids}
    assert len(firsts) == n and await registered_by_cold_plans(stack, firsts)
    taken_from_another = 0
    for ids in plan_ids:
        for prev, cur in itertools.pairwise(ids[1:]):
            assert rows[prev]["new_lease_id"], rows[prev]
            taken_from_another += rows[cur]["lease_id"] != rows[prev]["new_lease_id"]
    assert taken_from_another == 0
    assert stack.stats()["pulls"] - before["pulls"] == n * (turns - 1)
    assert stack.unsafe() == 0


async def test_a_fork_pulls_once_and_the_other_branch_recomputes(stack: GatewayStack, key: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Fork test. " * 50}, user(1000, 0)]
    before = stack.stats()
    async with stack.openai_client(key) as c:
        reply, _, _ = await chat(c, messages)
        messages.append({"role": "assistant", "content": reply})
        branches = await asyncio.gather(chat(c, messages + [user(1000, 1)]), chat(c, messages + [user(1001, 1)]))
    plans = sorted(h["x-boomerang-plan"] for _, h, _ in branches)
    assert plans == ["COLD", "PULL"] or plans == ["PULL", "RECOMPUTE"], plans
    assert stack.stats()["pulls"] - before["pulls"] == 1  # no block read twice
    assert stack.unsafe() == 0


async def test_another_tenant_sending_the_same_prompt_is_cold(stack: GatewayStack, key: str) -> None:
    other = stack.new_key("other")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Tenant test. " * 50}, user(2000, 0)]
    async with stack.openai_client(key) as mine_c, stack.openai_client(other) as theirs_c:
        reply, _, _ = await chat(mine_c, messages)
        messages += [{"role": "assistant", "content": reply}, user(2000, 1)]
        _, theirs, _ = await chat(theirs_c, messages)
        assert theirs["x-boomerang-plan"] == "COLD", theirs
        _, mine, _ = await chat(mine_c, messages)
    assert mine["x-boomerang-plan"] == "PULL", mine
    assert stack.unsafe() == 0


async def test_stripped_reasoning_pulls_the_verified_prefix(stack: GatewayStack, key: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Reasoning test. " * 60}, user(3000, 0)]
    async with stack.openai_client(key) as c:
        reply, _, first_prompt = await chat(c, messages, model=THINKING, max_tokens=64)
        assert "</think>" in reply
        messages += [{"role": "assistant", "content": reply}, user(3000, 1)]
        _, headers, _ = await chat(c, messages, model=THINKING)
    assert headers["x-boomerang-plan"] == "PULL", headers
    assert 0 < int(headers["x-boomerang-reused-tokens"]) <= first_prompt
    assert stack.unsafe() == 0


async def test_a_first_turn_that_only_starts_like_a_lease_is_cold_and_leaves_it(stack: GatewayStack, key: str) -> None:
    system = {"role": "system", "content": "Shared start. " * 80}
    mine: list[dict[str, Any]] = [system, user(4000, 0)]
    async with stack.openai_client(key) as c:
        reply, _, _ = await chat(c, mine)
        mine += [{"role": "assistant", "content": reply}, user(4000, 1)]
        _, stranger, _ = await chat(c, [system, user(4001, 0)])
        assert stranger["x-boomerang-plan"] == "COLD", stranger
        _, own, _ = await chat(c, mine)
    assert own["x-boomerang-plan"] == "PULL", own
    assert stack.unsafe() == 0


async def test_another_cache_salt_sending_the_same_prompt_is_cold(stack: GatewayStack, key: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Salt test. " * 50}, user(5000, 0)]
    async with stack.openai_client(key) as c:
        reply, first, _ = await chat(c, messages, cache_salt="salt-a")
        assert first["x-boomerang-plan"] == "COLD", first
        messages += [{"role": "assistant", "content": reply}, user(5000, 1)]
        _, unsalted, _ = await chat(c, messages)
        assert unsalted["x-boomerang-plan"] == "COLD", unsalted
        _, other, _ = await chat(c, messages, cache_salt="salt-b")
        assert other["x-boomerang-plan"] == "COLD", other
        _, same, _ = await chat(c, messages, cache_salt="salt-a")
    assert same["x-boomerang-plan"] == "PULL", same  # the lease was still there for its own salt
    assert stack.unsafe() == 0
