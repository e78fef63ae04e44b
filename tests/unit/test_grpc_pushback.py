"""A database outage is answered UNAVAILABLE with the push-back that stops client retries.

Boomerang's channels retry UNAVAILABLE (three attempts, with back-off) for a service that is
restarting; repeating a call that failed because Postgres is down only multiplies its time
(it made every claim of a Postgres outage take 200–500 ms on a loaded box, past the
router's claim deadline). The server counts the calls it gets: one for a database outage,
three for any other UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.router import RouterClient
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang_server.rpc.server import rpc


class Failing(rtgrpc.RouterServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.calls = 0
        self.error: BaseException = ConnectionRefusedError(111, "Connect call failed")

    @rpc
    async def PlanTurn(self, request: rtpb.PlanTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.PlanTurnResponse:
        self.calls += 1
        raise self.error


@pytest.fixture
async def served() -> AsyncIterator[tuple[Failing, str]]:
    servicer = Failing()
    server = grpc.aio.server()
    rtgrpc.add_RouterServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_database_outage_is_not_retried(served: tuple[Failing, str]) -> None:
    servicer, address = served
    async with RouterClient(address, timeout=5, plan_timeout=5) as client:
        with pytest.raises(BoomerangClientError) as err:
            await client.plan_turn(rtpb.PlanTurnRequest())
    assert (err.value.code, err.value.reason) == ("UNAVAILABLE", "DATABASE_UNAVAILABLE")
    assert servicer.calls == 1


async def test_any_other_unavailable_still_is(served: tuple[Failing, str]) -> None:
    servicer, address = served
    servicer.error = BoomerangError(Code.UNAVAILABLE, "REGISTRY_UNAVAILABLE", "try again")
    async with RouterClient(address, timeout=5, plan_timeout=5) as client:
        with pytest.raises(BoomerangClientError) as err:
            await client.plan_turn(rtpb.PlanTurnRequest())
    assert err.value.reason == "REGISTRY_UNAVAILABLE"
    assert servicer.calls == 3
