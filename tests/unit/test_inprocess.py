"""In-process calls (`boomerang control-plane`): the typed client over a local servicer reads back
what a network call would, errors and deadlines included, and streams end when cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.errors import FieldViolation, invalid
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_cli.control_plane import LocalStub
from boomerang_server.rpc.server import rpc


class Servicer:
    """Two registry methods behind the real `@rpc` translation, and the stream the gateway reads."""

    def __init__(self) -> None:
        self.callers: list[str] = []
        self.closed = asyncio.Event()

    async def authorize(self, method: str, request: Any, context: Any) -> None:
        self.callers.append(context.auth_context()["x509_common_name"][0].decode())

    @rpc
    async def ClaimReuse(self, request: rpb.ClaimReuseRequest, context: Any) -> rpb.ClaimReuseResponse:
        if not request.tenant:
            raise invalid([FieldViolation("tenant", "is required")])
        if request.conversation_id == "slow":
            await asyncio.sleep(5)
        return rpb.ClaimReuseResponse(reusable_tokens=len(request.conversation_id))

    async def WatchLeaseKeys(self, request: rpb.WatchLeaseKeysRequest, context: Any) -> AsyncIterator[rpb.WatchLeaseKeysResponse]:
        try:
            for n in range(1_000_000):
                yield rpb.WatchLeaseKeysResponse(snapshot=n % 2 == 0)
                await asyncio.sleep(0)
        finally:
            self.closed.set()


async def test_answers_errors_and_deadlines_read_back_as_over_the_network() -> None:
    servicer = Servicer()
    client = RegistryClient("in-process", timeout=0.2, stub=LocalStub(servicer, "service:router"))
    assert client.channel is None
    answer = await client.claim_reuse(rpb.ClaimReuseRequest(tenant="acme", conversation_id="abcd"))
    assert answer.reusable_tokens == 4 and servicer.callers == ["service:router"]
    with pytest.raises(BoomerangClientError) as bad:
        await client.claim_reuse(rpb.ClaimReuseRequest(conversation_id="c"))
    assert (bad.value.code, bad.value.reason) == ("INVALID_ARGUMENT", "INVALID_REQUEST")
    assert [v.field for v in bad.value.error.violations] == ["tenant"]
    with pytest.raises(BoomerangClientError) as late:
        await client.claim_reuse(rpb.ClaimReuseRequest(tenant="acme", conversation_id="slow"))
    assert late.value.code == "DEADLINE_EXCEEDED"
    await client.close()


async def test_a_stream_yields_until_the_reader_stops_and_then_ends() -> None:
    servicer = Servicer()
    client = RegistryClient("in-process", stub=LocalStub(servicer, "service:gateway"))
    seen = []
    async for message in client.watch_lease_keys("w"):
        seen.append(message)
        if len(seen) == 3:
            break
    await asyncio.wait_for(servicer.closed.wait(), 2)
    assert len(seen) == 3
