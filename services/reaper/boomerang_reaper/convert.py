"""Reaper values to protobuf messages and back (the advice travels both ways: the service
sends it, `boomerang advise-ttl --reaper` reads it back to print)."""

from __future__ import annotations

from datetime import datetime, timezone

from google.protobuf.timestamp_pb2 import Timestamp

from boomerang.v1 import reaper_service_pb2 as pb
from boomerang_reaper.advice import CandidateOutcome, TtlAdvice
from boomerang_reaper.domain import LagSummary


def ts(value: datetime | float | None) -> Timestamp | None:
    """A Timestamp from an aware datetime or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, tz=timezone.utc)
    out = Timestamp()
    out.FromDatetime(value)
    return out


def lag(summary: LagSummary) -> pb.LagSummary:
    """A LagSummary message."""
    return pb.LagSummary(
        count=summary.count, p50_seconds=summary.p50, p99_seconds=summary.p99, max_seconds=summary.max
    )


def advice_to_proto(a: TtlAdvice) -> pb.TtlAdvice:
    """A TtlAdvice message."""
    return pb.TtlAdvice(
        tenant=a.tenant,
        model=a.model,
        turns=a.turns,
        next_turns=a.next_turns,
        exact_pauses=a.exact_pauses,
        pause_percentiles=[pb.PausePercentile(percentile=q, seconds=s) for q, s in a.pause_percentiles],
        candidates=[
            pb.TtlCandidate(
                ttl_seconds=c.ttl_seconds,
                reuse_share=c.reuse_share,
                block_seconds=c.block_seconds,
                byte_seconds=c.byte_seconds,
                mean_resident_blocks=c.mean_resident_blocks,
                mean_resident_bytes=c.mean_resident_bytes,
                recommended=c.recommended,
                current=c.current,
            )
            for c in a.candidates
        ],
        recommended_ttl_seconds=a.recommended_ttl_seconds,
        current_ttl_seconds=a.current_ttl_seconds,
        bytes_known_share=a.bytes_known_share,
    )


def advice_from_proto(m: pb.TtlAdvice) -> TtlAdvice:
    """A TtlAdvice value from its message."""
    return TtlAdvice(
        tenant=m.tenant,
        model=m.model,
        turns=m.turns,
        next_turns=m.next_turns,
        exact_pauses=m.exact_pauses,
        pause_percentiles=[(p.percentile, p.seconds) for p in m.pause_percentiles],
        candidates=[
            CandidateOutcome(
                ttl_seconds=c.ttl_seconds,
                reuse_share=c.reuse_share,
                block_seconds=c.block_seconds,
                byte_seconds=c.byte_seconds,
                mean_resident_blocks=c.mean_resident_blocks,
                mean_resident_bytes=c.mean_resident_bytes,
                recommended=c.recommended,
                current=c.current,
            )
            for c in m.candidates
        ],
        recommended_ttl_seconds=m.recommended_ttl_seconds,
        current_ttl_seconds=m.current_ttl_seconds,
        bytes_known_share=m.bytes_known_share,
    )
