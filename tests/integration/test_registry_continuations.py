"""Claims without a conversation id against the real Postgres: the lease a prompt continues, only that one.

Every registration here carries no conversation id, only its previous prompt's length and
partial block; every claim carries the new prompt's tokens. A lease is claimed when its
previous prompt is wholly a prefix of the new prompt, never when the two only share a
start, never across tenants or cache salts, never twice.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_registry import wire
from boomerang_registry.claim_store import CONTINUE_CLAIM_SQL, continue_params
from boomerang_registry.repository import RegistryRepository
from boomerang_server.leases import ClaimOutcome
from sqlalchemy import text

from tests.integration.test_registry_repository import register_engine
from tests.support.registry_data import BLOCK
from tests.support.registry_repo import open_repository, register_blocks

pytestmark = pytest.mark.integration

Answer = tuple[ClaimOutcome, object, int, float]


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=20) as opened:
        yield opened


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def chain_msg(tokens: list[int], salt: str) -> tpb.TokenChain:
    c = build_chain(tokens, BLOCK, salt)
    return tpb.TokenChain(block_size=BLOCK, num_tokens=c.num_tokens, block_hashes=c.block_hashes, tail_hash=c.tail_hash)


async def retain(repo: RegistryRepository, tenant: str, eid: str, prompt: list[int], output: list[int],
                 salt: str = "") -> str:
    """Register a turn without a conversation id (as D's hook does): its prompt and output."""
    seq = prompt + output
    tail = len(prompt) % BLOCK
    req = rpb.RegisterRetainedBlocksRequest(
        tenant=tenant, engine_id=eid, engine_generation=1, remote_request_id=f"cmpl-{uuid.uuid4().hex}",
        block_groups=[tpb.BlockIdGroup(block_ids=list(range(-(-len(seq) // BLOCK))))],
        num_tokens=len(seq), token_chain=chain_msg(seq, salt), prompt_tokens=len(prompt),
        prompt_tail_token_ids=prompt[len(prompt) - tail:] if tail else [],
    )
    lease, created, superseded = await register_blocks(repo, wire.retained_blocks(req, 10**6, 10**7))
    assert created and superseded == 0
    return str(lease["lease_id"])


async def claim(repo: RegistryRepository, tenant: str, prompt: list[int], salt: str = "") -> Answer:
    req = rpb.ClaimReuseRequest(tenant=tenant, prompt_chain=chain_msg(prompt, salt), prompt_token_ids=prompt,
                                min_reusable_tokens=64, min_remaining_seconds=5.0, claim_id=str(uuid.uuid4()))
    return await repo.claims.claim(wire.claim(req))  # type: ignore[return-value]


def lease_of(answer: Answer) -> str | None:
    lease = answer[1]
    return None if lease is None or answer[0] is not ClaimOutcome.CLAIMED else str(lease["lease_id"])  # type: ignore[index]


async def test_64_interleaved_conversations_sharing_a_4k_system_prompt_each_claim_their_own(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    system = words(4096, seed=1)
    firsts = [system + words(5 + k % 40, seed=100 + k) for k in range(64)]  # some end inside the system's block
    outputs = [words(30 + k, seed=200 + k) for k in range(64)]
    leases = await asyncio.gather(*(retain(repo, tenant, eid, p, o) for p, o in zip(firsts, outputs, strict=True)))
    seconds = [p + o + words(20, seed=300 + k) for k, (p, o) in enumerate(zip(firsts, outputs, strict=True))]
    order = list(range(64))
    random.Random(7).shuffle(order)
    answers = await asyncio.gather(*(claim(repo, tenant, seconds[k]) for k in order))
    got = {k: lease_of(a) for k, a in zip(order, answers, strict=True)}
    taken_from_another = sum(1 for k, lease in got.items() if lease is not None and lease != leases[k])
    assert taken_from_another == 0
    assert all(got[k] == leases[k] for k in range(64))
    for k, a in zip(order, answers, strict=True):  # the verified prefix: prompt and answer's whole blocks
        assert a[2] == (len(firsts[k]) + len(outputs[k])) // BLOCK * BLOCK
    assert await pg.fetchval("SELECT count(*) FROM leases WHERE tenant = $1 AND state = 'CLAIMED'", tenant) == 64


async def test_a_fork_pulls_once_and_the_other_branch_recomputes(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    prompt, output = words(700, 1), words(90, 2)
    lease = await retain(repo, tenant, eid, prompt, output)
    a, b = await asyncio.gather(claim(repo, tenant, prompt + output + words(15, 3)),
                                claim(repo, tenant, prompt + output + words(40, 4)))
    assert sorted(x[0].value for x in (a, b)) == sorted([ClaimOutcome.CLAIMED.value, ClaimOutcome.ALREADY_CLAIMED.value])
    assert [lease_of(x) for x in (a, b) if lease_of(x)] == [lease]
    claims = await pg.fetchval(
        "SELECT count(*) FROM lease_events WHERE lease_id = $1 AND to_state = 'CLAIMED'", uuid.UUID(lease))
    assert claims == 1


async def test_another_tenant_or_another_salt_sending_the_same_prompt_finds_nothing(
    repo: RegistryRepository, unique: str
) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    prompt, output = words(500, 1), words(50, 2)
    lease = await retain(repo, tenant, eid, prompt, output, salt="alice")
    nxt = prompt + output + words(10, 3)
    assert (await claim(repo, f"u-{unique}", nxt, salt="alice"))[0] is ClaimOutcome.NO_LEASE
    assert (await claim(repo, tenant, nxt, salt="bob"))[0] is ClaimOutcome.NO_LEASE
    assert (await claim(repo, tenant, nxt))[0] is ClaimOutcome.NO_LEASE
    assert lease_of(await claim(repo, tenant, nxt, salt="alice")) == lease


async def test_an_answer_stripped_of_its_reasoning_pulls_the_verified_prefix(repo: RegistryRepository, unique: str) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    prompt = words(1000 + 7, 1)  # ends 7 tokens into a block
    reasoning, content = words(300, 2), words(60, 3)
    lease = await retain(repo, tenant, eid, prompt, reasoning + content)
    answer = await claim(repo, tenant, prompt + content + words(25, 4))
    assert lease_of(answer) == lease
    assert answer[2] == len(prompt) // BLOCK * BLOCK


async def test_a_first_turn_that_starts_like_a_lease_but_does_not_continue_it_is_cold(
    repo: RegistryRepository, unique: str
) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    system = words(4096 + 3, 1)
    mine = system + words(6, 2)  # its whole blocks are all the system prompt's: only its tail is its own
    lease = await retain(repo, tenant, eid, mine, words(40, 3))
    stranger = system + words(6, 4) + words(200, 5)
    assert (await claim(repo, tenant, stranger))[0] is ClaimOutcome.NO_LEASE
    longer = system + words(300, 6)  # another conversation, past the system prompt by many blocks
    assert (await claim(repo, tenant, longer))[0] is ClaimOutcome.NO_LEASE
    assert (await claim(repo, tenant, system))[0] is ClaimOutcome.NO_LEASE  # the shared start alone
    assert (await claim(repo, tenant, mine))[0] is ClaimOutcome.NO_LEASE  # the same turn asked again
    own = await claim(repo, tenant, mine + words(40, 3) + words(12, 7))
    assert lease_of(own) == lease


async def test_the_longest_previous_prompt_wins_and_a_retry_returns_its_claim(repo: RegistryRepository, unique: str) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    p1, o1 = words(300, 1), words(40, 2)
    p2 = p1 + o1 + words(50, 3)
    o2 = words(33, 4)
    await retain(repo, tenant, eid, p1, o1)  # turn 1, never claimed (its turn 2 recomputed)
    second = await retain(repo, tenant, eid, p2, o2)
    prompt = p2 + o2 + words(9, 5)
    req = rpb.ClaimReuseRequest(tenant=tenant, prompt_chain=chain_msg(prompt, ""), prompt_token_ids=prompt,
                                min_reusable_tokens=64, claim_id=str(uuid.uuid4()))
    first = await repo.claims.claim(wire.claim(req))
    again = await repo.claims.claim(wire.claim(req))
    assert lease_of(first) == second  # type: ignore[arg-type]
    assert again[0] is ClaimOutcome.CLAIMED and again[1]["lease_id"] == second  # type: ignore[index]


async def test_a_claim_without_its_tokens_is_refused(unique: str) -> None:
    from boomerang.errors import BoomerangError

    prompt = words(100, 1)
    req = rpb.ClaimReuseRequest(tenant=f"t-{unique}", prompt_chain=chain_msg(prompt, ""), claim_id="c")
    with pytest.raises(BoomerangError, match="prompt_token_ids"):
        wire.claim(req)


async def test_the_lookup_is_one_index_scan(repo: RegistryRepository, unique: str) -> None:
    prompt = words(6000, 1)
    q = wire.claim(rpb.ClaimReuseRequest(tenant=f"t-{unique}", prompt_chain=chain_msg(prompt, ""),
                                             prompt_token_ids=prompt, claim_id="c"))
    params = {**continue_params(q), "actor": "test"}
    async with repo.owner.connect() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in await conn.execute(text("EXPLAIN " + CONTINUE_CLAIM_SQL), params))
        await conn.rollback()
    assert "ix_leases_live_prompt_key" in plan
    assert "Seq Scan on leases" not in plan
