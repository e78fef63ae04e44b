"""What every typed Boomerang client shares: the one client error, and for the asyncio
clients their channel (from `boomerang.grpcutil`), default deadline and `async with`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import grpc

from boomerang.errors import BoomerangError
from boomerang.grpcutil import aio_channel, from_rpc_error


class BoomerangClientError(Exception):
    """A failed call: the gRPC code, the stable reason, the message and any bad fields."""

    def __init__(self, method: str, error: BoomerangError):
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error

    @property
    def code(self) -> str:
        """The canonical code name, e.g. `FAILED_PRECONDITION`."""
        return self.error.code.value

    @property
    def reason(self) -> str:
        """The stable machine-readable reason, e.g. `STALE_GENERATION`."""
        return self.error.reason


T = TypeVar("T")


async def call(method: str, fn: Callable[..., Awaitable[T]], request: Any, timeout: float | None) -> T:
    """Invoke a stub method with a deadline, turning failures into BoomerangClientError."""
    try:
        return await fn(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        raise BoomerangClientError(method, from_rpc_error(err)) from None


class AsyncClient:
    """One service's asyncio client: per-call deadlines (seconds) and one error type."""

    service = ""  # the gRPC service, e.g. "boomerang.v1.RouterService"
    stub_class: Any = None  # its generated stub

    def __init__(self, target: str, timeout: float = 5.0, stub: Any = None):
        """`stub`: the service in this process (`boomerang_cli.control_plane.LocalStub`), no
        channel."""
        self.target = target
        self.timeout = timeout
        self.channel = aio_channel(target, [self.service]) if stub is None else None
        self.stub = stub if stub is not None else self.stub_class(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        if self.channel is not None:
            await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
