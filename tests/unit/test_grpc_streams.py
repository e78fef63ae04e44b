"""The `*Stream` RPCs' machinery (boomerang.grpcutil.streams, boomerang.clients.streams) over a
real in-process gRPC server: every message answered as its unary call would be, by id, with
its own deadline and authentication; the caller reopens a broken stream and falls back to
unary calls for a server without the stream method."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.router import RouterClient
from boomerang.errors import BoomerangError, Code, Violations
from boomerang.grpcutil.streams import serve_items
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import router_service_pb2_grpc as rtgrpc
from boomerang_server.rpc.status import rpc


class Planner(rtgrpc.RouterServiceServicer):
    """PlanTurn answers `plan_id = "plan-" + conversation_id` after `delays[conversation_id]`
    seconds; model "" is a bad request; callers must present the bearer token `secret`."""

    def __init__(self, streams: bool = True) -> None:
        self.delays: dict[str, float] = {}
        self.served: list[str] = []
        self.authorized: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.streams = streams

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.authorized.append(method)
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != "Bearer secret":
            raise BoomerangError(Code.UNAUTHENTICATED, "BAD_TOKEN", "the bearer token is unknown or revoked")

    @rpc
    async def PlanTurn(self, request: rtpb.PlanTurnRequest, context: grpc.aio.ServicerContext) -> rtpb.PlanTurnResponse:
        v = Violations()
        if not request.model:
            v.add("model", "is required")
        v.raise_if_any()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delays.get(request.conversation_id, 0.0))
        finally:
            self.in_flight -= 1
        self.served.append(request.conversation_id)
        return rtpb.PlanTurnResponse(plan_id=f"plan-{request.conversation_id}",
                                     recompute_tokens=int(context.time_remaining() * 1000))

    async def PlanTurnStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if not self.streams:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        async for answer in serve_items(self, self.PlanTurn, request_iterator, context, rtpb.PlanTurnStreamResponse,
                                        max_in_flight=4):
            yield answer


async def start(planner: Planner, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    rtgrpc.add_RouterServiceServicer_to_server(planner, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", "secret")


def plan(conversation: str, model: str = "m") -> rtpb.PlanTurnRequest:
    return rtpb.PlanTurnRequest(tenant="t", conversation_id=conversation, model=model)


async def test_answers_match_their_requests_out_of_order(token: None) -> None:
    planner = Planner()
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            planner.delays = {"slow": 0.3, "mid": 0.1}
            answers = await asyncio.gather(*(client.plan_turn(plan(c)) for c in ("slow", "mid", "fast")))
            assert [a.plan_id for a in answers] == ["plan-slow", "plan-mid", "plan-fast"]
            assert planner.served == ["fast", "mid", "slow"]  # served concurrently, answered by id
            assert client.plans is not None and client.plans.streams_opened == 1
            # Each message is authenticated and its deadline is its own, not the stream's.
            assert planner.authorized == ["PlanTurn"] * 3
            short = await client.plan_turn(plan("x"), timeout=0.5)
            assert 0 < short.recompute_tokens <= 500
    finally:
        await server.stop(0)


async def test_a_bad_message_fails_alone_naming_its_field(token: None) -> None:
    planner = Planner()
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            with pytest.raises(BoomerangClientError) as err:
                await client.plan_turn(plan("a", model=""))
            assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", "INVALID_REQUEST")
            assert [v.field for v in err.value.error.violations] == ["model"]
            assert (await client.plan_turn(plan("b"))).plan_id == "plan-b"  # the stream goes on
            assert client.plans is not None and client.plans.streams_opened == 1
    finally:
        await server.stop(0)


async def test_unauthenticated_messages_are_refused_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", "revoked")
    planner = Planner()
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            for _ in range(2):
                with pytest.raises(BoomerangClientError) as err:
                    await client.plan_turn(plan("a"))
                assert (err.value.code, err.value.reason) == ("UNAUTHENTICATED", "BAD_TOKEN")
            assert planner.served == []
    finally:
        await server.stop(0)


async def test_a_message_past_its_deadline_is_cancelled_and_says_so(token: None) -> None:
    planner = Planner()
    planner.delays = {"slow": 2.0}
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            with pytest.raises(BoomerangClientError) as err:
                await client.plan_turn(plan("slow"), timeout=0.2)
            assert err.value.code == "DEADLINE_EXCEEDED"
            await asyncio.sleep(0.3)
            assert planner.in_flight == 0 and "slow" not in planner.served  # the server gave up too
            # A message without a deadline is refused rather than served forever.
            assert client.plans is not None
            call = client.stub.PlanTurnStream()
            await call.write(rtpb.PlanTurnStreamRequest(id=7, request=plan("a")))
            answer = await call.read()
            call.cancel()
            assert (answer.id, answer.error_code) == (7, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            assert "timeout_seconds" in answer.error_message
    finally:
        await server.stop(0)


async def test_a_stream_holds_at_most_max_in_flight_unanswered(token: None) -> None:
    planner = Planner()
    planner.delays = {f"c{i}": 0.1 for i in range(12)}
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            answers = await asyncio.gather(*(client.plan_turn(plan(f"c{i}")) for i in range(12)))
            assert sorted(a.plan_id for a in answers) == sorted(f"plan-c{i}" for i in range(12))
            assert planner.most_in_flight == 4
    finally:
        await server.stop(0)


async def test_a_restarted_server_gets_a_new_stream(token: None) -> None:
    planner = Planner()
    server, port = await start(planner)
    async with RouterClient(f"127.0.0.1:{port}", plan_timeout=2.0, streams=True) as client:
        assert (await client.plan_turn(plan("a"))).plan_id == "plan-a"
        planner.delays = {"cut": 1.0}
        cut = asyncio.ensure_future(client.plan_turn(plan("cut")))
        await asyncio.sleep(0.1)
        await server.stop(0)  # the stream breaks with "cut" unanswered
        server, _ = await start(planner, port)
        try:
            # "cut" is sent once more on a new stream (PlanTurn is idempotent) and answered.
            assert (await cut).plan_id == "plan-cut"
            assert (await client.plan_turn(plan("b"))).plan_id == "plan-b"
            assert client.plans is not None and client.plans.streams_opened == 2
        finally:
            await server.stop(0)


async def test_a_server_without_the_stream_is_called_unary(token: None) -> None:
    planner = Planner(streams=False)
    server, port = await start(planner)
    try:
        async with RouterClient(f"127.0.0.1:{port}", plan_timeout=5.0, streams=True) as client:
            assert (await client.plan_turn(plan("a"))).plan_id == "plan-a"
            assert client.plans is not None and not client.plans.streaming
            assert (await client.plan_turn(plan("b"))).plan_id == "plan-b"
            assert client.plans.streams_opened == 1  # asked once, then unary until the recheck
    finally:
        await server.stop(0)


async def test_every_kind_of_call_carries_the_bearer_token(token: None) -> None:
    """grpc.aio files an interceptor under the first kind of call it implements only; the
    channel's token must still reach unary, server-streaming and bidirectional calls."""
    from boomerang.grpcutil.channel import aio_channel

    seen: list[str] = []

    def authorization(context: grpc.aio.ServicerContext) -> str:
        return str(dict(context.invocation_metadata() or ()).get("authorization", ""))

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append("unary " + authorization(context))
        return b""

    async def server_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        seen.append("server-stream " + authorization(context))
        yield b""

    async def bidi(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        seen.append("bidi " + authorization(context))
        async for _ in requests:
            yield b""

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {
        "U": grpc.unary_unary_rpc_method_handler(unary),
        "S": grpc.unary_stream_rpc_method_handler(server_stream),
        "B": grpc.stream_stream_rpc_method_handler(bidi),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio_channel(f"127.0.0.1:{port}", ["t.T"])
    try:
        await channel.unary_unary("/t.T/U")(b"")
        async for _ in channel.unary_stream("/t.T/S")(b""):
            pass
        call = channel.stream_stream("/t.T/B")()
        await call.write(b"")
        await call.read()
        await call.done_writing()
        assert seen == ["unary Bearer secret", "server-stream Bearer secret", "bidi Bearer secret"]
    finally:
        await channel.close()
        await server.stop(0)
