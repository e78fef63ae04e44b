"""How Boomerang's callers live with a failing peer: which failures are transient, a circuit
breaker, and an exponential back-off. Used by the router (its registry claims and reports),
the gateway (its router calls) and the vLLM hook (its plan, report and registration calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# gRPC codes (`BoomerangClientError.code`) that say "not now" rather than "this request is
# wrong", so the same request may succeed later. Retrying is safe because every Boomerang
# RPC is idempotent (by request id or natural key; see the protos). Beyond the obvious
# UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED:
# * INTERNAL and UNKNOWN are what a server answers when a handler fails unexpectedly (a
#   database that dropped the connection mid-transaction, say) and what a client sees when
#   the connection breaks mid-call; neither says anything about the request itself.
# * CANCELLED reaches a client when the server cancels its call (a service that finishes its
#   drain with calls in flight) or the client's channel is closed under it: the peer went
#   away, the request was fine.
# The router once left CANCELLED out and the hook UNKNOWN; both are transient for the same
# reasons, so both lists are this one.
TRANSIENT_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "UNKNOWN", "CANCELLED"}
)
# gRPC codes that say the peer refused this very request (a bad field, an unknown plan, a
# tenant it does not serve): the peer is fine, so a breaker does not count them. The vLLM
# hook's planner counts every other failed plan (codes in neither set too) against the
# router; the gateway counts only TRANSIENT_CODES, because its breaker pauses every model's
# turns and an answer outside those is about one request.
REFUSAL_CODES = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION"}
)


class CircuitBreaker:
    """Stops calling a failing peer for a while, so callers answer at once while it is down.

    After `threshold` consecutive failures the breaker opens for `cooldown` seconds; then it
    lets a trial call through. With `one_trial` (the default) only that call goes out until
    it reports (or, should it never report, another cooldown passes); success closes the
    breaker, failure reopens it. Each failed trial multiplies the cooldown by `growth`, up to
    `max_cooldown`; success resets it. Calls already in flight when it opened that fail after
    change nothing (eight hanging plans failing together once made a 0.5 s pause 16 s). A
    `threshold` of 0 disables the breaker.
    """

    def __init__(
        self,
        threshold: int,
        cooldown: float,
        *,
        growth: float = 1.0,
        max_cooldown: float | None = None,
        one_trial: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.threshold = threshold
        self.first_cooldown = cooldown
        self.cooldown = cooldown
        self.growth = growth
        self.max_cooldown = cooldown if max_cooldown is None else max_cooldown
        self.one_trial = one_trial
        self.clock = clock
        self.consecutive = 0
        self.open_until = 0.0
        self.opened = 0  # how many times it opened (not counting reopenings after a trial)
        self._trial = False  # a call went out after the pause: its failure reopens the breaker

    @property
    def is_open(self) -> bool:
        """Whether enough failures in a row have been seen to refuse calls (outside trials)."""
        return self.threshold > 0 and self.consecutive >= self.threshold

    def allow(self) -> bool:
        """Whether the next call may go out now."""
        if not self.is_open:
            return True
        now = self.clock()
        if now < self.open_until:
            return False
        self._trial = True
        if self.one_trial:
            self.open_until = now + self.cooldown  # this caller is the trial; the rest wait
        return True

    def record_success(self) -> None:
        """A call answered: close."""
        self.consecutive = 0
        self.cooldown = self.first_cooldown
        self._trial = False

    def record_failure(self) -> None:
        """A call failed or timed out: count it, and (re)open once at the threshold."""
        self.consecutive += 1
        if not self.is_open:
            return
        if self.consecutive == self.threshold:
            self.opened += 1
        elif self._trial:
            self._trial = False
            self.cooldown = min(self.cooldown * self.growth, self.max_cooldown)
        else:
            return  # a call sent before the breaker opened: it is open already
        self.open_until = self.clock() + self.cooldown

    def trip(self) -> None:
        """A failure that says the peer is down (not slow): open now, whatever the count."""
        if self.threshold > 0:
            self.consecutive = max(self.consecutive, self.threshold - 1)
            self.record_failure()


class Backoff:
    """Exponential pause between failed attempts (doubling from `first` up to `most`), reset by
    a success."""

    def __init__(self, first: float = 0.05, most: float = 2.0):
        self.first, self.most, self.current = first, most, first

    def next(self) -> float:
        """The pause to take now; the following one doubles."""
        value = self.current
        self.current = min(self.current * 2, self.most)
        return value

    def reset(self) -> None:
        """Back to the first pause."""
        self.current = self.first
