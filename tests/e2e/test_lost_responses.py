"""Client retries after a lost response: one lease, one event per idempotency key."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb

from tests.support.lossy_proxy import LossyProxy
from tests.support.procs import ServiceProcess
from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.router_stack import running_registry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture
async def lossy(registry: ServiceProcess) -> AsyncIterator[tuple[LossyProxy, RegistryClient, RegistryClient]]:
    proxy = LossyProxy(registry.address)
    address = await proxy.start()
    # One client through the proxy (its channel retries UNAVAILABLE itself, so each call
    # loses several responses) and one direct client for the final retry.
    async with RegistryClient(address, timeout=5) as via_proxy, RegistryClient(registry.address) as direct:
        yield proxy, via_proxy, direct
    await proxy.stop()


async def lose(proxy: LossyProxy, coro) -> None:  # type: ignore[no-untyped-def]
    proxy.lose_responses = True
    try:
        with pytest.raises(BoomerangClientError) as err:
            await coro
        assert err.value.code == "UNAVAILABLE"
    finally:
        proxy.lose_responses = False


async def test_every_mutating_call_retried_after_a_lost_response_takes_effect_once(
    lossy: tuple[LossyProxy, RegistryClient, RegistryClient], pg: asyncpg.Connection, unique: str
) -> None:
    proxy, via_proxy, direct = lossy
    eid = f"d-{unique}"
    await direct.register_engine(engine_request(eid))
    tokens = list(range(400))

    register = blocks_request("lost", unique, eid, tokens, request_id=f"rr-{unique}")
    await lose(proxy, via_proxy.register_retained_blocks(register))
    retried = await direct.register_retained_blocks(register)
    assert not retried.created, "the lost registration had been committed: the retry must find it"
    lease_id = retried.lease.lease_id

    claim = claim_request("lost", unique, tokens + [1], claim_id=f"claim-{unique}")
    await lose(proxy, via_proxy.claim_reuse(claim))
    claimed = await direct.claim_reuse(claim)
    assert claimed.outcome == rpb.CLAIM_OUTCOME_CLAIMED and claimed.lease.lease_id == lease_id
    assert claimed.reusable_tokens == 400

    consume = rpb.CompleteTurnRequest(
        tenant="lost", claim=rpb.TurnClaim(lease_id=lease_id, claim_id=f"claim-{unique}", use=rpb.CLAIM_USE_READ)
    )
    await lose(proxy, via_proxy.complete_turn(consume))
    assert (await direct.complete_turn(consume)).claim.lease.state == claimed.lease.state + 1  # CONSUMED

    assert proxy.lost >= 3  # every attempt through the proxy reached the server and was lost
    leases = await pg.fetchval("SELECT count(*) FROM leases WHERE tenant = 'lost' AND conversation_id = $1", unique)
    assert leases == 1
    events = [r["reason"] for r in await pg.fetch(
        "SELECT reason FROM lease_events WHERE lease_id = $1 ORDER BY event_id", uuid.UUID(lease_id))]
    assert events == ["REGISTERED", "CLAIMED", "PREFILL_READ"]


async def test_a_turn_end_retried_after_a_lost_response_consumes_and_registers_once(
    lossy: tuple[LossyProxy, RegistryClient, RegistryClient], pg: asyncpg.Connection, unique: str
) -> None:
    """CompleteTurn: the claim consumed and the next lease registered, one transaction; the
    retry after a lost answer finds both done (the same new lease, created False)."""
    proxy, via_proxy, direct = lossy
    eid = f"d-{unique}"
    await direct.register_engine(engine_request(eid))
    tokens = list(range(400))
    first = await direct.register_retained_blocks(blocks_request("lost", unique, eid, tokens))
    claimed = await direct.claim_reuse(claim_request("lost", unique, tokens + [1], claim_id=f"claim-{unique}"))
    assert claimed.outcome == rpb.CLAIM_OUTCOME_CLAIMED

    end = rpb.CompleteTurnRequest(
        tenant="lost",
        claim=rpb.TurnClaim(lease_id=first.lease.lease_id, claim_id=f"claim-{unique}", use=rpb.CLAIM_USE_READ),
        registration=blocks_request("", unique, eid, [*tokens, 1, 2, 3], request_id=f"end-{unique}"),
    )
    await lose(proxy, via_proxy.complete_turn(end))
    retried = await direct.complete_turn(end)
    assert retried.claim.error_code == 0 and retried.claim.lease.state == claimed.lease.state + 1  # CONSUMED
    assert retried.registration.error_code == 0 and not retried.registration.response.created
    assert proxy.lost >= 1
    rows = await pg.fetch(
        "SELECT l.lease_id, l.state, array_agg(e.reason ORDER BY e.event_id) AS reasons FROM leases l "
        "JOIN lease_events e USING (lease_id) WHERE l.tenant = 'lost' AND l.conversation_id = $1 "
        "GROUP BY l.lease_id, l.state", unique)
    trail = {str(r["lease_id"]): (r["state"], r["reasons"]) for r in rows}
    assert trail == {
        first.lease.lease_id: ("CONSUMED", ["REGISTERED", "CLAIMED", "PREFILL_READ"]),
        retried.registration.response.lease.lease_id: ("RETAINED", ["REGISTERED"]),
    }
