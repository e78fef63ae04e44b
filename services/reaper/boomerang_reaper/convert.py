"""Reaper values to protobuf messages and back (the advice travels both ways: the service
sends it, `boomerang advise-ttl --reaper` reads it back to print)."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

from boomerang.v1 import reaper_service_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from boomerang_reaper.advice import CandidateOutcome, TtlAdvice
from boomerang_reaper.domain import LagSummary


def ts(value: datetime | float | None) -> Timestamp | None:
    """A Timestamp from an aware datetime or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, tz=UTC)
    out = Timestamp()
    out.FromDatetime(value)
    return out


def lag(summary: LagSummary) -> pb.LagSummary:
    """A LagSummary message."""
    return pb.LagSummary(
        count=summary.count, p50_seconds=summary.p50, p99_seconds=summary.p99, max_seconds=summary.max
    )


# The advice messages carry the dataclasses' fields under the same names; only the
# nested lists differ in form.
_SCALARS = [f.name for f in fields(TtlAdvice) if f.name not in ("pause_percentiles", "candidates")]
_CANDIDATE = [f.name for f in fields(CandidateOutcome)]


def advice_to_proto(a: TtlAdvice) -> pb.TtlAdvice:
    """A TtlAdvice message."""
    return pb.TtlAdvice(
        **{name: getattr(a, name) for name in _SCALARS},
        pause_percentiles=[pb.PausePercentile(percentile=q, seconds=s) for q, s in a.pause_percentiles],
        candidates=[pb.TtlCandidate(**{name: getattr(c, name) for name in _CANDIDATE}) for c in a.candidates],
    )


def advice_from_proto(m: pb.TtlAdvice) -> TtlAdvice:
    """A TtlAdvice value from its message."""
    return TtlAdvice(
        **{name: getattr(m, name) for name in _SCALARS},
        pause_percentiles=[(p.percentile, p.seconds) for p in m.pause_percentiles],
        candidates=[CandidateOutcome(**{name: getattr(c, name) for name in _CANDIDATE}) for c in m.candidates],
    )
