"""A lease's states and a claim's outcomes: the names the registry stores, the router decides
on, and the operator commands count (the one definition; SQL statements spell the live states
out as `state IN ('RETAINED', 'CLAIMED')`, the partial indexes of migration 0001)."""

from __future__ import annotations

import enum


class LeaseState(str, enum.Enum):
    """A lease's state, stored by name."""

    RETAINED = "RETAINED"
    CLAIMED = "CLAIMED"
    CONSUMED = "CONSUMED"
    EXPIRED = "EXPIRED"
    SUPERSEDED = "SUPERSEDED"
    INVALIDATED = "INVALIDATED"
    # Ended early by the retention policy or memory pressure; D was told to free the blocks.
    RELEASED = "RELEASED"


# Live leases still hold a decode engine's blocks; ended ones never change again.
LIVE = frozenset({LeaseState.RETAINED, LeaseState.CLAIMED})
LIVE_STATES = tuple(s.value for s in LeaseState if s in LIVE)
ENDED_STATES = tuple(s.value for s in LeaseState if s not in LIVE)
ALL_STATES = tuple(s.value for s in LeaseState)
# The live states as an SQL list, for `state IN {LIVE_SQL}`.
LIVE_SQL = "(" + ", ".join(f"'{s}'" for s in LIVE_STATES) + ")"


class ClaimOutcome(str, enum.Enum):
    """Why a claim did or did not hand out a lease (the proto's ClaimOutcome, by name)."""

    CLAIMED = "CLAIMED"
    NO_LEASE = "NO_LEASE"
    EXPIRING = "EXPIRING"
    PREFIX_MISMATCH = "PREFIX_MISMATCH"
    BELOW_THRESHOLD = "BELOW_THRESHOLD"
    ENGINE_INVALID = "ENGINE_INVALID"
    ALREADY_CLAIMED = "ALREADY_CLAIMED"
    BLOCK_SIZE_MISMATCH = "BLOCK_SIZE_MISMATCH"
    # Nothing live, and the newest lease was released early: reuse lost to an early release.
    LEASE_RELEASED = "LEASE_RELEASED"
    # The router's own, never answered by the registry: the registry did not answer in
    # time, failed, or the router's breaker is open...
    UNAVAILABLE = "UNAVAILABLE"
    # ...or there was no conversation id, so nothing was asked.
    NOT_ASKED = "NOT_ASKED"
