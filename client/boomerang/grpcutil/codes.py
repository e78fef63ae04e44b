"""Boomerang's error codes as gRPC status codes, both ways: what a server sends for a domain
error (status.py) and what a client reads back into one (client_status.py)."""

from __future__ import annotations

import grpc

from boomerang.errors import Code

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
