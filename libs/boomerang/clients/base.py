"""What every typed Boomerang client shares: channels, deadlines, the one client error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from boomerang.auth import TlsFiles, client_token
from boomerang.errors import BoomerangError
from boomerang.grpcutil.retry import retry_service_config
from boomerang.grpcutil.server import grpc_channel_options
from boomerang.grpcutil.status import from_rpc_error
from boomerang.telemetry import grpc_client_interceptors


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


class _BearerToken(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str):
        self.metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self.metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(client_call_details), request)


def aio_channel(target: str, services: list[str], max_message_bytes: int = 16 * 1024 * 1024) -> grpc.aio.Channel:
    """An asyncio channel that retries UNAVAILABLE for the given services.

    It uses TLS when `BOOMERANG_TLS_*` files are configured (mutual TLS with a client
    certificate) and presents `BOOMERANG_AUTH_TOKEN` as a bearer token when set.
    """
    options: list[tuple[str, Any]] = [
        *grpc_channel_options(max_message_bytes),
        ("grpc.service_config", retry_service_config(services)),
        ("grpc.enable_retries", 1),
    ]
    interceptors: list[Any] = list(grpc_client_interceptors())
    token = client_token()
    if token:
        interceptors.append(_BearerToken(token))
    tls = TlsFiles.from_env()
    if tls.enabled:
        return grpc.aio.secure_channel(target, tls.channel_credentials(), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


T = TypeVar("T")


async def call(method: str, fn: Callable[..., Awaitable[T]], request: Any, timeout: float | None) -> T:
    """Invoke a stub method with a deadline, turning failures into BoomerangClientError."""
    try:
        return await fn(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        raise BoomerangClientError(method, from_rpc_error(err)) from None
