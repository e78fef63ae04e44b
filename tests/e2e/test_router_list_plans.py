"""RouterService.ListTurnPlans against a real router and registry on the real Postgres: one
conversation's plans, oldest first, paged without duplicates or gaps (also while new plans
arrive), one tenant's only, every bad field refused with INVALID_ARGUMENT, and anonymous
callers refused where the router requires authentication."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from tests.support.procs import BOOMERANG, ServiceProcess
from tests.support.router_stack import running_registry, running_router

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
    with running_router(database_url, registry.address) as proc:
        yield proc


@pytest.fixture
async def client(router: ServiceProcess) -> AsyncIterator[RouterClient]:
    async with RouterClient(router.address, plan_timeout=5.0) as c:
        yield c


async def engines(router: RouterClient, registry: ServiceProcess, unique: str) -> str:
    """A prefill and a decode engine for a fresh model, in the router's pool; the model."""
    model = f"m-{unique}"
    async with RegistryClient(registry.address) as rc:
        for role, name in ((tpb.ENGINE_ROLE_PREFILL, "p"), (tpb.ENGINE_ROLE_DECODE, "d")):
            await rc.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
                engine_id=f"{name}-{unique}", role=role, model=model, side_channel_host="127.0.0.1",
                side_channel_port=5600, http_base_url="http://127.0.0.1:8000", registration_generation=1,
                block_size=16)))
    for _ in range(200):  # the pool refreshes every 0.2 s
        pool = await router.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))
        if sum(e.available for e in pool.engines) == 2:
            return model
        await asyncio.sleep(0.05)
    raise AssertionError("the engines never reached the router's pool")


async def plan(client: RouterClient, tenant: str, conversation: str, model: str, n: int) -> list[str]:
    """`n` plans of the conversation (COLD: nothing is ever registered), in the order made."""
    ids = []
    for i in range(n):
        p = await client.plan_turn(rtpb.PlanTurnRequest(
            tenant=tenant, conversation_id=conversation, model=model, prompt_token_ids=list(range(1, 40 + i))))
        ids.append(p.plan_id)
    return ids


async def pages(client: RouterClient, tenant: str, conversation: str, size: int) -> list[list[str]]:
    """Every page's plan ids, following next_page_token to the end."""
    out: list[list[str]] = []
    token = ""
    while True:
        got = await client.list_turn_plans(rtpb.ListTurnPlansRequest(
            tenant=tenant, conversation_id=conversation, page_size=size, page_token=token))
        out.append([p.plan_id for p in got.plans])
        token = got.next_page_token
        if not token:
            return out


async def test_pages_list_every_plan_once_oldest_first(client: RouterClient, registry: ServiceProcess,
                                                       unique: str) -> None:
    model = await engines(client, registry, unique)
    conv = f"c-{unique}"
    made = await plan(client, "acme", conv, model, 17)
    await plan(client, "acme", f"other-{unique}", model, 2)  # another conversation of the tenant
    listed = await pages(client, "acme", conv, 5)
    assert [len(p) for p in listed] == [5, 5, 5, 2]
    assert [i for p in listed for i in p] == made  # oldest first, no duplicate, no gap

    # A page that ends exactly at the last plan says so: no token to an empty page.
    assert [len(p) for p in await pages(client, "acme", conv, 17)] == [17]
    # The default page holds them all (100); every plan carries its decision and conversation.
    got = await client.list_turn_plans(rtpb.ListTurnPlansRequest(tenant="acme", conversation_id=conv))
    assert [p.plan_id for p in got.plans] == made and got.next_page_token == ""
    assert {(p.decision, p.reason, p.tenant) for p in got.plans} == {
        (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_NO_LEASE, "acme")}


async def test_paging_is_stable_while_plans_arrive(client: RouterClient, registry: ServiceProcess, unique: str) -> None:
    model = await engines(client, registry, unique)
    conv = f"c-{unique}"
    made = await plan(client, "acme", conv, model, 6)
    first = await client.list_turn_plans(rtpb.ListTurnPlansRequest(tenant="acme", conversation_id=conv, page_size=4))
    assert [p.plan_id for p in first.plans] == made[:4] and first.next_page_token
    later = await plan(client, "acme", conv, model, 3)
    rest: list[str] = []
    token = first.next_page_token
    while token:
        got = await client.list_turn_plans(rtpb.ListTurnPlansRequest(
            tenant="acme", conversation_id=conv, page_size=4, page_token=token))
        rest += [p.plan_id for p in got.plans]
        token = got.next_page_token
    assert rest == made[4:] + later


async def test_another_tenant_sees_nothing(client: RouterClient, registry: ServiceProcess, unique: str) -> None:
    model = await engines(client, registry, unique)
    conv = f"c-{unique}"
    await plan(client, "acme", conv, model, 3)
    other = await client.list_turn_plans(rtpb.ListTurnPlansRequest(tenant=f"t-{unique}", conversation_id=conv))
    assert list(other.plans) == [] and other.next_page_token == ""
    # Nor can it follow acme's token: the token names the listing it was issued for.
    page = await client.list_turn_plans(rtpb.ListTurnPlansRequest(tenant="acme", conversation_id=conv, page_size=1))
    with pytest.raises(BoomerangClientError) as err:
        await client.list_turn_plans(rtpb.ListTurnPlansRequest(
            tenant=f"t-{unique}", conversation_id=conv, page_token=page.next_page_token))
    assert err.value.code == "INVALID_ARGUMENT"
    assert [v.field for v in err.value.error.violations] == ["page_token"]


@pytest.mark.parametrize(
    ("request_fields", "field", "words"),
    [
        ({"conversation_id": "c"}, "tenant", "is required"),
        ({"tenant": "has space", "conversation_id": "c"}, "tenant", "printable ASCII"),
        ({"tenant": "acme"}, "conversation_id", "is required"),
        ({"tenant": "acme", "conversation_id": "x" * 257}, "conversation_id", "at most 256"),
        ({"tenant": "acme", "conversation_id": "c", "page_size": -1}, "page_size", "0 (default 100) to 1000"),
        ({"tenant": "acme", "conversation_id": "c", "page_size": 1001}, "page_size", "0 (default 100) to 1000"),
        ({"tenant": "acme", "conversation_id": "c", "page_token": "not a token"}, "page_token", "list again without one"),
        ({"tenant": "acme", "conversation_id": "c", "page_token": "AQ"}, "page_token", "list again without one"),
    ],
)
async def test_bad_requests_name_the_field(client: RouterClient, request_fields: dict[str, object], field: str,
                                           words: str) -> None:
    with pytest.raises(BoomerangClientError) as err:
        await client.list_turn_plans(rtpb.ListTurnPlansRequest(**request_fields))  # type: ignore[arg-type]
    assert err.value.code == "INVALID_ARGUMENT"
    violations = {v.field: v.description for v in err.value.error.violations}
    assert list(violations) == [field] and words in violations[field], violations


async def test_a_token_of_another_conversation_is_refused(client: RouterClient, registry: ServiceProcess,
                                                          unique: str) -> None:
    model = await engines(client, registry, unique)
    await plan(client, "acme", f"c-{unique}", model, 2)
    page = await client.list_turn_plans(rtpb.ListTurnPlansRequest(tenant="acme", conversation_id=f"c-{unique}",
                                                                  page_size=1))
    with pytest.raises(BoomerangClientError) as err:
        await client.list_turn_plans(rtpb.ListTurnPlansRequest(
            tenant="acme", conversation_id=f"d-{unique}", page_token=page.next_page_token))
    assert err.value.code == "INVALID_ARGUMENT"
    (v,) = err.value.error.violations
    assert v.field == "page_token" and "same tenant and conversation_id" in v.description


async def test_required_auth_refuses_anonymous_listing(database_url: str, registry: ServiceProcess, unique: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    router = ServiceProcess(
        ["router", "--listen", "127.0.0.1:0", "--registry", registry.address],
        {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"},
    ).start()
    try:
        req = rtpb.ListTurnPlansRequest(tenant="acme", conversation_id=f"c-{unique}")
        async with RouterClient(router.address) as anonymous:
            with pytest.raises(BoomerangClientError) as err:
                await anonymous.list_turn_plans(req)
            assert (err.value.code, err.value.reason) == ("UNAUTHENTICATED", "NO_CREDENTIALS")
        out = subprocess.run([BOOMERANG, "credentials", "create", f"service:gw-{unique}", "--database-url", database_url],
                             capture_output=True, text=True, check=True)
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", out.stdout.split()[1])
        async with RouterClient(router.address) as gateway:
            assert list((await gateway.list_turn_plans(req)).plans) == []
    finally:
        router.kill()
