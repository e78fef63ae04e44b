"""The one place where domain errors become gRPC statuses, and back again on the client.

Servicer methods are wrapped with `@rpc`: a `BoomerangError` is sent as its canonical code
with `google.rpc.ErrorInfo` (domain `boomerang.dev`, a stable reason) and, for bad input,
`google.rpc.BadRequest` field violations; a lost database becomes UNAVAILABLE; anything
else is logged and sent as INTERNAL without internals.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from boomerang.errors import BoomerangError, Code, FieldViolation

log = logging.getLogger(__name__)
ERROR_DOMAIN = "boomerang.dev"

_GRPC_CODES = {
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
_FROM_GRPC = {v: k for k, v in _GRPC_CODES.items()}
_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


def to_status(err: BoomerangError) -> grpc.Status:
    """A rich gRPC status for a domain error."""
    code = _GRPC_CODES[err.code]
    details = []
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata)
    details.append(info)
    if err.violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                    for v in err.violations
                ]
            )
        )
    packed = []
    for detail in details:
        any_msg = any_pb2.Any()
        any_msg.Pack(detail)
        packed.append(any_msg)
    proto = status_pb2.Status(code=getattr(code_pb2, code.name), message=err.message, details=packed)
    return rpc_status.to_status(proto)


def no_retry(status: grpc.Status) -> grpc.Status:
    """`status` with the server's push-back that tells gRPC clients not to retry it (gRFC A6).

    Clients retry UNAVAILABLE transparently (a restarting service is back in milliseconds),
    but a database outage is not: three attempts with back-off only turned each failing
    call into ~200–500 ms on a loaded box, past a plan's claim deadline. The caller's own
    breaker and back-off handle an outage; the channel's retries still cover the transport.
    """
    return status._replace(trailing_metadata=(*status.trailing_metadata, (PUSHBACK_KEY, "-1")))


PUSHBACK_KEY = "grpc-retry-pushback-ms"


def _is_database_outage(exc: BaseException) -> bool:
    """True for errors that mean Postgres is unreachable, not that the request is wrong."""
    # deferred: the database drivers load only in a server that meets an error; the vLLM hook
    # imports this module inside vLLM's environment, which need not have them
    import asyncpg
    import sqlalchemy.exc

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(
            seen,
            (
                OSError,
                ConnectionError,
                TimeoutError,
                asyncpg.exceptions.CannotConnectNowError,
                asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.InterfaceError,
                asyncpg.exceptions.AdminShutdownError,
                sqlalchemy.exc.DisconnectionError,
                sqlalchemy.exc.TimeoutError,
            ),
        ):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def error_for_exception(exc: BaseException) -> BoomerangError:
    """The domain error to report for any exception raised while serving."""
    if isinstance(exc, BoomerangError):
        return exc
    if _is_database_outage(exc):
        return BoomerangError(Code.UNAVAILABLE, "DATABASE_UNAVAILABLE", "the database is unreachable; retry later")
    log.exception("unexpected error while serving a call")
    return BoomerangError(Code.INTERNAL, "INTERNAL", "internal error; see the service log")


Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def authorized_call(
    servicer: Any, method: Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]], request: Req,
    context: grpc.aio.ServicerContext,
) -> Resp:
    """`method` (a servicer method, unwrapped) on `request`, after the servicer's `authorize`
    when it has one; its errors raised as they are (`@rpc` and the stream items translate them)."""
    authorize = getattr(servicer, "authorize", None)
    if authorize is not None:
        await authorize(method.__name__, request, context)
    return await method(servicer, request, context)


def rpc(method: Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]) -> Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """Wrap a servicer method so every failure leaves as a proper status.

    When the servicer has an `authorize(method_name, request, context)` coroutine, it runs
    first: authentication and authorization happen before validation or any work.
    """

    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await authorized_call(self, method, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - this is the translation boundary
            error = error_for_exception(exc)
            status = to_status(error)
            if error.reason == "DATABASE_UNAVAILABLE":
                status = no_retry(status)
            await context.abort_with_status(status)
            raise AssertionError("unreachable: abort_with_status raises")  # pragma: no cover

    return wrapper


def code_number(err: BoomerangError) -> int:
    """The numeric gRPC code of a domain error, for a failed item of a batch or stream answer
    (what `from_code_number` reads back)."""
    return int(_GRPC_CODES[err.code].value[0])


def write_item_error(item: Any, exc: BaseException) -> None:
    """Set an answer item's `error_code`, `error_reason` and `error_message` (a batch result
    or a stream response) to the failure `@rpc` would have answered the call alone with."""
    err = error_for_exception(exc)
    item.error_code = code_number(err)
    item.error_reason = err.reason
    item.error_message = err.message
    if err.violations and hasattr(item, "error_fields"):
        for v in err.violations:
            item.error_fields.add(field=v.field, description=v.description)


def from_code_number(number: int, reason: str, message: str, fields: Iterable[Any] = ()) -> BoomerangError:
    """The domain error of one failed item of a batch or stream answer (its numeric gRPC code,
    reason, message and any `FieldViolation`s), as the same call alone would have raised it:
    an unmapped code is INTERNAL and keeps its own name, and an empty reason is the code's name."""
    grpc_code = _BY_NUMBER.get(number)
    code = _FROM_GRPC.get(grpc_code, Code.INTERNAL) if grpc_code is not None else Code.INTERNAL
    name = grpc_code.name if grpc_code is not None else Code.INTERNAL.value
    return BoomerangError(code, reason or name, message, [FieldViolation(f.field, f.description) for f in fields])


def from_rpc_error(err: grpc.RpcError) -> BoomerangError:
    """The domain error a client received (code, reason and field violations)."""
    grpc_code = err.code() if hasattr(err, "code") else None
    code = _FROM_GRPC.get(grpc_code, Code.INTERNAL)
    # A code Boomerang never answers (UNIMPLEMENTED from an older server, UNKNOWN, ...) keeps
    # its own name as the reason, so a caller can tell it from the server's INTERNAL.
    unmapped = grpc_code is not None and grpc_code not in _FROM_GRPC
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
