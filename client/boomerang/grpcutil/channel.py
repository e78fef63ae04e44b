"""Channels to Boomerang's services, asyncio and blocking: message limits, transparent retries of
UNAVAILABLE, TLS and the bearer token from `BOOMERANG_TLS_*` and `BOOMERANG_AUTH_TOKEN`, and the
trace interceptors when tracing is on. The typed clients (`boomerang.clients`) and the health
check build on these."""

from __future__ import annotations

from typing import Any

import grpc

from boomerang.auth import TlsFiles, client_token
from boomerang.grpcutil.options import grpc_channel_options
from boomerang.grpcutil.retry import retry_service_config
from boomerang.telemetry import grpc_client_interceptors


# grpc ships no type information: its interceptor bases are Any to mypy.
class _BearerToken:
    """Adds `authorization: Bearer <token>` to every call of one kind.

    One object per kind of call: grpc.aio files an interceptor under the first kind it
    implements only, so one object implementing several would leave streams without the token.
    """

    def __init__(self, token: str):
        self.metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self.metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(client_call_details), request)


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(client_call_details), request)


class _StreamStreamToken(_BearerToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(client_call_details), request_iterator)


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
        interceptors += [_UnaryUnaryToken(token), _UnaryStreamToken(token), _StreamStreamToken(token)]
    tls = TlsFiles.from_env()
    if tls.enabled:
        return grpc.aio.secure_channel(target, tls.channel_credentials(), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


def sync_channel(
    target: str,
    services: list[str],
    *,
    retries: bool = True,
    tls: TlsFiles | None = None,
    max_message_bytes: int = 16 * 1024 * 1024,
) -> grpc.Channel:
    """A blocking channel (TLS when `tls` is enabled); retries UNAVAILABLE for `services`
    unless `retries` is False."""
    options: list[tuple[str, Any]] = list(grpc_channel_options(max_message_bytes))
    if retries:
        options += [("grpc.service_config", retry_service_config(services)), ("grpc.enable_retries", 1)]
    else:
        options += [("grpc.enable_retries", 0)]
    if tls is not None and tls.enabled:
        channel = grpc.secure_channel(target, tls.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if grpc_client_interceptors():  # tracing is on: carry the trace on blocking calls too
        # deferred: OpenTelemetry loads only once tracing is on
        from opentelemetry.instrumentation.grpc import client_interceptor

        channel = grpc.intercept_channel(channel, client_interceptor())  # type: ignore[no-untyped-call]
    return channel
