"""One unary RPC's calls carried as messages of a long-lived bidirectional stream.

A Python gRPC unary call costs its client and its server each about 0.3–0.5 ms of CPU
before any work (the call's setup, its HTTP/2 stream, the completion-queue round trips); a
message on a stream that is already open costs a third of that (`make bench` measures both).
The hot-path RPCs therefore have a `*Stream` twin (PlanTurnStream, ClaimReuseStream): each
request message is an envelope `{id, timeout_seconds, request, trace_context}` and each
response message `{id, response | error_code, error_reason, error_message}`.

Serving (`serve_items`): every message is served as its own call would be, by the same
servicer method: authenticated from the stream's credentials each time (a revoked token stops
working on an open stream too), validated, bounded by its own deadline (cancelled past it,
as gRPC cancels a unary handler), its failure sent as the code, reason and message `@rpc`
sends for a unary call. Answers leave as they are ready, in any order; a stream holds at most
`max_in_flight` unanswered messages, after which it stops reading (HTTP/2 flow control then
holds the sender back).

Calling (`boomerang.clients.streams.StreamCaller`): calls share one stream, opened on first use and reopened after it
breaks; each waits at most its own deadline. A call whose stream broke before its answer is
sent once more on a new stream while its deadline allows (every streamed RPC is idempotent by
its request's own key). A server without the stream method (UNIMPLEMENTED) is called unary
instead, and asked again after `recheck_seconds`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from boomerang_server.rpc.status import authorized_call, write_item_error

from boomerang import telemetry
from boomerang.errors import BoomerangError, Code


class _ItemContext:
    """The servicer context one message is served with: the stream's own (peer, metadata,
    TLS identity, used to authenticate it) with the message's deadline."""

    def __init__(self, stream: grpc.aio.ServicerContext, deadline: float):
        self._stream = stream
        self._deadline = deadline

    def time_remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> Any:
        return self._stream.invocation_metadata()

    def auth_context(self) -> Any:
        return self._stream.auth_context()

    def peer(self) -> str:
        return str(self._stream.peer())


def retrieve_exception(done: asyncio.Future[Any]) -> None:
    """A done-callback that marks a task's or future's error as read: on a stream that broke,
    the error may find no one left to await it, and asyncio would log it as lost."""
    if not done.cancelled():
        done.exception()


def deadline_error(method: str, timeout: float) -> BoomerangError:
    """The error of a call or message that ran past its deadline."""
    return BoomerangError(
        Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", f"{method} took longer than its {timeout * 1000:.0f} ms deadline"
    )


def service_name(envelope: Any, method: str) -> str:
    """The full name of the service in `envelope`'s proto file that has `method`."""
    for service in envelope.DESCRIPTOR.file.services_by_name.values():
        if method in service.methods_by_name:
            return str(service.full_name)
    raise ValueError(f"no service in {envelope.DESCRIPTOR.file.name} has a method {method}")


async def serve_items(
    servicer: Any,
    method: Callable[..., Awaitable[Any]],
    envelopes: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    response_type: Callable[..., Any],
    *,
    max_in_flight: int = 256,
) -> AsyncIterator[Any]:
    """Serve a `*Stream` RPC: each envelope's request through `method` (an `@rpc` servicer
    method of `servicer`; its unwrapped body runs, after the servicer's `authorize`), each
    answer as a `response_type` envelope with the request's id."""
    body = getattr(method, "__wrapped__", method)
    name = f"/{service_name(response_type, body.__name__)}/{body.__name__}"  # the unary call's span name
    answers: asyncio.Queue[Any] = asyncio.Queue()
    room = asyncio.Semaphore(max_in_flight)
    running: set[asyncio.Task[None]] = set()

    async def serve(env: Any) -> None:
        answer = response_type(id=env.id)
        try:
            if not env.timeout_seconds > 0:
                raise BoomerangError(
                    Code.INVALID_ARGUMENT, "INVALID_REQUEST",
                    "timeout_seconds must be greater than 0: it is the message's deadline, as a unary call's",
                )
            deadline = time.monotonic() + env.timeout_seconds
            with telemetry.served_span(name, env.trace_context):
                try:
                    async with asyncio.timeout(env.timeout_seconds):
                        result = await authorized_call(servicer, body, env.request, _ItemContext(context, deadline))
                except TimeoutError:
                    raise deadline_error(body.__name__, env.timeout_seconds) from None
            answer.response.CopyFrom(result)
        except Exception as exc:  # noqa: BLE001 - this is the translation boundary, as @rpc's
            write_item_error(answer, exc)
        finally:
            room.release()
        answers.put_nowait(answer)

    async def read() -> None:
        try:
            async for env in envelopes:
                await room.acquire()
                task = asyncio.create_task(serve(env))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            answers.put_nowait(None)

    reader = asyncio.create_task(read())
    # A cancelled stream closes its request iterator under the reader; that error is moot.
    reader.add_done_callback(retrieve_exception)
    try:
        while (answer := await answers.get()) is not None:
            yield answer
        await reader  # the caller's half-close, or the error that broke the stream
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
