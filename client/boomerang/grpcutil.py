"""gRPC as Boomerang's clients and servers share it: error codes both ways, channel options,
and the channels to Boomerang's services.

* Boomerang's error codes as gRPC status codes: what a server sends for a domain error
  (`boomerang_server.rpc.server`) and what a client reads back into one (`from_rpc_error`,
  `from_code_number`).
* Channel options shared by servers (`boomerang_server.rpc.server`) and clients, here so the
  client side, which the vLLM hook ships, does not import the server's health and reflection
  services (and their distributions) to read six numbers.
* Channels, asyncio and blocking: message limits, transparent retries of UNAVAILABLE, TLS and
  the bearer token from `BOOMERANG_TLS_*` and `BOOMERANG_AUTH_TOKEN`, and the trace
  interceptors when tracing is on. The typed clients (`boomerang.clients`) and the health
  check build on these.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from boomerang.auth import TlsFiles, client_token
from boomerang.errors import BoomerangError, Code, FieldViolation
from boomerang.telemetry import grpc_client_interceptors

GRPC_CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
}
DOMAIN_CODES = {v: k for k, v in GRPC_CODES.items()}
# gRPC codes by number: a failed item of a batch or stream answer carries its code as one.
BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


def from_code_number(number: int, reason: str, message: str) -> BoomerangError:
    """The domain error of one failed item of a batch answer (its numeric gRPC code, reason
    and message): an unmapped code is INTERNAL and keeps its own name, and an empty reason is
    the code's name."""
    grpc_code = BY_NUMBER.get(number)
    code = DOMAIN_CODES.get(grpc_code, Code.INTERNAL) if grpc_code is not None else Code.INTERNAL
    name = grpc_code.name if grpc_code is not None else Code.INTERNAL.value
    return BoomerangError(code, reason or name, message)


def from_rpc_error(err: grpc.RpcError) -> BoomerangError:
    """The domain error a client received (code, reason and field violations)."""
    grpc_code = err.code() if hasattr(err, "code") else None
    code = DOMAIN_CODES.get(grpc_code, Code.INTERNAL)
    # A code Boomerang never answers (UNIMPLEMENTED from an older server, UNKNOWN, ...) keeps
    # its own name as the reason, so a caller can tell it from the server's INTERNAL.
    unmapped = grpc_code is not None and grpc_code not in DOMAIN_CODES
    reason, violations = (str(getattr(grpc_code, "name", code.value)) if unmapped else code.value), []
    status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = [FieldViolation(v.field, v.description) for v in bad.field_violations]
    message = err.details() if hasattr(err, "details") else str(err)
    return BoomerangError(code, reason, message or "", violations)


def grpc_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel options shared by servers and clients."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.http2.max_pings_without_data", 0),
        # Clients find a restarted service within seconds, not after gRPC's default
        # reconnect back-off of up to two minutes (servers ignore these).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


# Retries only UNAVAILABLE, and clients enable it only for idempotent methods (every
# Boomerang RPC is idempotent by request id or natural key; see the protos).
def client_options(services: list[str], retries: bool = True) -> list[tuple[str, Any]]:
    """A client channel's options: the shared ones (16 MiB messages) and, unless `retries` is
    False, a service config that retries UNAVAILABLE with back-off for these services."""
    options: list[tuple[str, Any]] = list(grpc_channel_options(16 * 1024 * 1024))
    if not retries:
        return [*options, ("grpc.enable_retries", 0)]
    config = {
        "methodConfig": [
            {
                "name": [{"service": name} for name in services],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return [*options, ("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]


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


def aio_channel(target: str, services: list[str]) -> grpc.aio.Channel:
    """An asyncio channel that retries UNAVAILABLE for the given services.

    It uses TLS when `BOOMERANG_TLS_*` files are configured (mutual TLS with a client
    certificate) and presents `BOOMERANG_AUTH_TOKEN` as a bearer token when set.
    """
    options = client_options(services)
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
) -> grpc.Channel:
    """A blocking channel (TLS when `tls` is enabled); retries UNAVAILABLE for `services`
    unless `retries` is False."""
    options = client_options(services, retries)
    if tls is not None and tls.enabled:
        channel = grpc.secure_channel(target, tls.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if grpc_client_interceptors():  # tracing is on: carry the trace on blocking calls too
        # deferred: OpenTelemetry loads only once tracing is on
        from opentelemetry.instrumentation.grpc import client_interceptor

        channel = grpc.intercept_channel(channel, client_interceptor())  # type: ignore[no-untyped-call]
    return channel
