"""The server's side of errors: the one place where domain errors become gRPC statuses.

Servicer methods are wrapped with `@rpc`: a `BoomerangError` is sent as its canonical code
with `google.rpc.ErrorInfo` (domain `boomerang.dev`, a stable reason) and, for bad input,
`google.rpc.BadRequest` field violations; a lost database becomes UNAVAILABLE; anything
else is logged and sent as INTERNAL without internals. A client reads them back with
`boomerang.grpcutil` (`from_rpc_error`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import GRPC_CODES
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

log = logging.getLogger(__name__)
ERROR_DOMAIN = "boomerang.dev"


def to_status(err: BoomerangError) -> grpc.Status:
    """A rich gRPC status for a domain error."""
    code = GRPC_CODES[err.code]
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
    # deferred: the database drivers load only in a server that meets an error; a server
    # without a database imports this module too
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
    return int(GRPC_CODES[err.code].value[0])


def write_item_error(item: Any, exc: BaseException) -> None:
    """Set a batch result's `error_code`, `error_reason` and `error_message` to the failure
    `@rpc` would have answered the call alone with."""
    err = error_for_exception(exc)
    item.error_code = code_number(err)
    item.error_reason = err.reason
    item.error_message = err.message
