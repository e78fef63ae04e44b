"""What every typed Boomerang client shares: deadlines and the one client error (channels come
from `boomerang.grpcutil.channel`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from boomerang.errors import BoomerangError
from boomerang.grpcutil.client_status import from_rpc_error


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
