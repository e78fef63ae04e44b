"""A batch item's numeric gRPC code becomes the domain error its call alone would have raised."""

from __future__ import annotations

import grpc
from boomerang.errors import Code
from boomerang.grpcutil import from_code_number


def test_mapped_code_keeps_reason_and_message() -> None:
    err = from_code_number(grpc.StatusCode.FAILED_PRECONDITION.value[0], "STALE_GENERATION", "old")
    assert (err.code, err.reason, err.message) == (Code.FAILED_PRECONDITION, "STALE_GENERATION", "old")


def test_empty_reason_is_the_code_name() -> None:
    assert from_code_number(grpc.StatusCode.UNAVAILABLE.value[0], "", "").reason == "UNAVAILABLE"


def test_unmapped_code_is_internal_with_its_own_name() -> None:
    err = from_code_number(grpc.StatusCode.UNIMPLEMENTED.value[0], "", "no such method")
    assert (err.code, err.reason) == (Code.INTERNAL, "UNIMPLEMENTED")


def test_unknown_number_is_internal() -> None:
    err = from_code_number(999, "", "")
    assert (err.code, err.reason) == (Code.INTERNAL, "INTERNAL")
