"""The calling side of the `*Stream` RPCs (see `boomerang.grpcutil.streams` for the
envelopes and how a server answers them)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc

from boomerang import telemetry
from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil.client_status import from_code_number, from_rpc_error
from boomerang.grpcutil.streams import deadline_error, retrieve_exception, service_name

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def _drain(outbox: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """The request messages of one stream, as callers put them in its outbox (None ends it)."""
    while (message := await outbox.get()) is not None:
        yield message


class StreamBroken(Exception):
    """The stream ended before a message's answer arrived."""

    def __init__(self, error: BoomerangError):
        super().__init__(str(error))
        self.error = error


class StreamCaller(Generic[Req, Resp]):
    """Calls of one unary RPC as messages on a long-lived stream of its `*Stream` twin.

    `open_stream(requests)` opens the twin (a stub's stream-stream method) on an async
    iterator of request messages; `envelope(id=, timeout_seconds=, request=, trace_context=)` builds a request
    message; `unary(request, timeout)` is the plain call, for servers without the twin.
    """

    def __init__(
        self,
        method: str,
        open_stream: Callable[[AsyncIterator[Any]], Any],
        envelope: Callable[..., Any],
        unary: Callable[[Req, float], Awaitable[Resp]],
        *,
        recheck_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.method = method
        self.span_name = f"/{service_name(envelope, method)}/{method}"  # the unary call's span name
        self._open = open_stream
        self._envelope = envelope
        self._unary = unary
        self._recheck = recheck_seconds
        self._clock = clock
        self._ids = itertools.count(1)
        self._call: Any = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._outbox: asyncio.Queue[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._unary_until = 0.0
        self.streams_opened = 0

    @property
    def streaming(self) -> bool:
        """Whether calls go on the stream now (not unary, for a server without the twin)."""
        return self._clock() >= self._unary_until

    async def __call__(self, request: Req, timeout: float) -> Resp:
        """The call's answer, or BoomerangClientError as the unary call would raise it."""
        if not self.streaming:
            return await self._unary(request, timeout)
        deadline = self._clock() + timeout
        for attempt in (1, 2):
            try:
                answer = await self._exchange(request, deadline)
            except StreamBroken as broken:
                if broken.error.reason == "UNIMPLEMENTED":
                    self._unary_until = self._clock() + self._recheck
                    log.info("%s: the server has no stream method; calling it unary for %.0f s",
                             self.method, self._recheck)
                    return await self._unary(request, max(deadline - self._clock(), 0.001))
                if attempt == 2 or deadline - self._clock() <= 0.001:
                    raise BoomerangClientError(self.method, broken.error) from None
                continue
            if answer.error_code:
                raise BoomerangClientError(
                    self.method, from_code_number(answer.error_code, answer.error_reason, answer.error_message, answer.error_fields)
                )
            response: Resp = answer.response
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(self, request: Req, deadline: float) -> Any:
        timeout = deadline - self._clock()
        if timeout <= 0:
            raise BoomerangClientError(self.method, deadline_error(self.method, 0.0))
        outbox = self._stream()
        key = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(retrieve_exception)  # a broken stream's error may find its caller gone
        self._pending[key] = answer
        try:
            try:
                async with asyncio.timeout(timeout):
                    with telemetry.client_span(self.span_name):
                        outbox.put_nowait(self._envelope(
                            id=key, timeout_seconds=timeout, request=request, trace_context=telemetry.trace_carrier()
                        ))
                        return await answer
            except TimeoutError:
                raise BoomerangClientError(self.method, deadline_error(self.method, timeout)) from None
        finally:
            self._pending.pop(key, None)

    def _stream(self) -> asyncio.Queue[Any]:
        """The open stream's outbox (gRPC sends what is put there, in order, without the
        callers waiting for each write), opening the stream first if need be."""
        if self._outbox is None:  # set and cleared with `_call`
            outbox: asyncio.Queue[Any] = asyncio.Queue()
            with telemetry.detached():  # the stream outlives the request that opened it
                self._call = self._open(_drain(outbox))
            self._outbox = outbox
            self.streams_opened += 1
            self._reader = asyncio.create_task(self._read(self._call))
        return self._outbox

    async def _read(self, call: Any) -> None:
        error: BoomerangError | None = None
        try:
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    break
                waiting = self._pending.get(answer.id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except asyncio.CancelledError:
            error = BoomerangError(Code.CANCELLED, "CANCELLED", f"the {self.method} stream was closed")
            raise
        except grpc.aio.AioRpcError as err:
            error = from_rpc_error(err)
        finally:
            if self._call is call:
                self._call, self._outbox = None, None
            error = error or BoomerangError(Code.UNAVAILABLE, "STREAM_CLOSED", f"the server ended the {self.method} stream")
            for waiting in self._pending.values():
                if not waiting.done():
                    waiting.set_exception(StreamBroken(error))

    async def close(self) -> None:
        """End the stream (calls still waiting fail as CANCELLED)."""
        call, self._call = self._call, None
        if self._outbox is not None:
            self._outbox.put_nowait(None)  # ends the request stream
            self._outbox = None
        if call is not None:
            call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
            self._reader = None
