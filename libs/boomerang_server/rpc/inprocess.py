"""In-process calls: a typed client's stub that calls a servicer in this process, no network.

When services run in one process (`boomerang control-plane`), the router reaches the
registry through `LocalStub(registry_servicer)` in place of the generated gRPC stub: the same
typed client (`RegistryClient(..., stub=...)`), the same servicer methods with their
validation, authorization and error translation, the same error a caller reads back
(`grpc.aio.AioRpcError` carrying the rich status in its trailing metadata), but no
serialization, no HTTP/2 and no second event-loop hop. The caller is authenticated as the
principal it is given (`service:router`), presented as a verified certificate name would be.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc


class _Aborted(Exception):
    """A servicer ended the call with a status (`abort`, `abort_with_status`)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str | bytes], ...]):
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, trailing

    def rpc_error(self) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(*self.trailing), self.details)


class LocalContext:
    """What Boomerang's servicers use of `grpc.aio.ServicerContext`, for an in-process call."""

    def __init__(self, principal: str, timeout: float | None):
        self._principal = principal.encode()
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self._principal]}

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "in-process"

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise _Aborted(status.code, status.details, tuple(status.trailing_metadata or ()))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details, tuple(trailing_metadata or ()))


class _Stream:
    """A server-streaming call's answer: iterate it; `cancel` ends it."""

    def __init__(self, items: AsyncIterator[Any]):
        self._items = items

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._read()

    async def _read(self) -> AsyncIterator[Any]:
        try:
            async for item in self._items:
                yield item
        except _Aborted as aborted:
            raise aborted.rpc_error() from None

    def cancel(self) -> bool:
        asyncio.ensure_future(self._items.aclose())  # type: ignore[attr-defined]
        return True


class LocalStub:
    """A generated stub's shape (`stub.Method(request, timeout=…)`) over a local servicer."""

    def __init__(self, servicer: Any, principal: str):
        self._servicer = servicer
        self._principal = principal

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The call of servicer method `name`, made once and kept (later lookups find it set)."""
        call = self._call(getattr(self._servicer, name))
        setattr(self, name, call)
        return call

    def _call(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(method):
            def stream(request: Any, timeout: float | None = None, **_: Any) -> _Stream:
                return _Stream(method(request, LocalContext(self._principal, timeout)))
            return stream

        async def unary(request: Any, timeout: float | None = None, **_: Any) -> Any:
            try:
                return await asyncio.wait_for(method(request, LocalContext(self._principal, timeout)), timeout)
            except _Aborted as aborted:
                raise aborted.rpc_error() from None
            except TimeoutError:
                raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                           grpc.aio.Metadata(), "Deadline Exceeded") from None
        return unary
