"""Domain errors: what went wrong, in terms a caller can act on.

Domain and repository code raise these; the gRPC edge (`boomerang_server.rpc.server`) is the
one place that turns them into status codes with `google.rpc.ErrorInfo` and `BadRequest`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Code(enum.Enum):
    """The canonical error classes Boomerang uses (a subset of gRPC's)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"


@dataclass(frozen=True)
class FieldViolation:
    """One bad request field: its path (e.g. `token_chain.block_size`) and what is wrong."""

    field: str
    description: str


@dataclass
class BoomerangError(Exception):
    """An error with a canonical code, a stable machine-readable reason and a message."""

    code: Code
    reason: str
    message: str
    violations: list[FieldViolation] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code.value} {self.reason}: {self.message}"


def invalid(violations: list[FieldViolation]) -> BoomerangError:
    """An INVALID_ARGUMENT error listing every bad field."""
    summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return BoomerangError(Code.INVALID_ARGUMENT, "INVALID_REQUEST", summary, violations)


def not_found(reason: str, message: str) -> BoomerangError:
    """A NOT_FOUND error."""
    return BoomerangError(Code.NOT_FOUND, reason, message)


def failed_precondition(reason: str, message: str) -> BoomerangError:
    """A FAILED_PRECONDITION error."""
    return BoomerangError(Code.FAILED_PRECONDITION, reason, message)


class Violations:
    """Collects field violations so a request reports all its problems at once."""

    def __init__(self) -> None:
        self.items: list[FieldViolation] = []

    def add(self, field_path: str, description: str) -> None:
        """Record that `field_path` is bad."""
        self.items.append(FieldViolation(field_path, description))

    def require(self, ok: bool, field_path: str, description: str) -> None:
        """Record a violation unless `ok`."""
        if not ok:
            self.add(field_path, description)

    def raise_if_any(self) -> None:
        """Raise INVALID_ARGUMENT when anything was recorded."""
        if self.items:
            raise invalid(self.items)
