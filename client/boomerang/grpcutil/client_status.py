"""The client's side of errors: a failed call, or a failed item of a batch answer,
read back into the domain error the server raised (status.py is the server's side).

Clients, the router's registry adapter and the vLLM hook import this alone, none of the
serving code.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from boomerang.errors import BoomerangError, Code, FieldViolation
from boomerang.grpcutil.codes import BY_NUMBER, DOMAIN_CODES


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
