"""Many items in one call, with the answer each item's own call would have had.

Both background senders of the hook send this way: the decode side's registrations
(RegisterRetainedBlocksBatch) and the prefill side's reports (ReportTurnBatch). A round's
items go out in calls of at most `MAX_CALL` (the services' limit), all in flight at once, and
come back as one answer per item, in order — the response, or the error that item's single
call would have raised — so the sender sorts them exactly as it sorts single calls:

* a service older than the batched RPC answers it UNIMPLEMENTED: from then on this sender
  makes single calls (up to a round's worth in flight at once);
* an error of the whole call that each single call would have had too (transient, or one
  the caller names, such as "register the engine first") is each item's answer;
* any other refusal of the whole call (a bad batch, a permission) is sent again as single
  calls in the same round, so that each item gets its own answer;
* a response with the wrong number of results is an INTERNAL error for each item.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import result
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil.client_status import from_code_number
from boomerang.resilience import TRANSIENT_CODES

log = logging.getLogger(__name__)

MAX_CALL = 256  # items per batched call: the registry's and the router's limit

E = TypeVar("E")
# What one item got back: its response, or the error its own call would have raised.
Answer = Any


@dataclass(frozen=True)
class BatchedRpc(Generic[E]):
    """One RPC and its batched form, as a sender makes them for its items."""

    single_name: str  # e.g. "ReportTurn"
    batch_name: str  # e.g. "ReportTurnBatch"
    service: str  # who answers, for the log: "router", "registry"
    single_future: Callable[[E], Any]  # the single call of one item, in flight
    batch_future: Callable[[Sequence[E]], Any]  # one batched call of a chunk, in flight
    # Errors of the whole call that stand for each item's own answer besides the transient ones.
    whole_call_answers: Callable[[BoomerangClientError], bool] = lambda err: False


class BatchedSender(Generic[E]):
    """Sends a round of items batched until the service shows it has no batched RPC."""

    def __init__(self, rpc: BatchedRpc[E]):
        self.rpc = rpc
        self.batched = True  # until the service answers the batched RPC UNIMPLEMENTED
        self.batch_calls = 0
        self.single_calls = 0

    def send(self, items: list[E]) -> list[tuple[E, Answer]]:
        """Each item with its answer, in order."""
        if not items:
            return []
        return self._batched(items) if self.batched else self._singly(items)

    def _singly(self, items: list[E]) -> list[tuple[E, Answer]]:
        calls = [(item, self.rpc.single_future(item)) for item in items]
        self.single_calls += len(calls)
        answers: list[tuple[E, Answer]] = []
        for item, future in calls:
            try:
                answers.append((item, result(self.rpc.single_name, future)))
            except BoomerangClientError as err:
                answers.append((item, err))
        return answers

    def _batched(self, items: list[E]) -> list[tuple[E, Answer]]:
        chunks = [items[n : n + MAX_CALL] for n in range(0, len(items), MAX_CALL)]
        calls = [(chunk, self.rpc.batch_future(chunk)) for chunk in chunks]
        self.batch_calls += len(calls)
        answers: list[tuple[E, Answer]] = []
        singly: list[E] = []
        for chunk, future in calls:
            try:
                resp = result(self.rpc.batch_name, future)
            except BoomerangClientError as err:
                if err.reason == "UNIMPLEMENTED":
                    if self.batched:
                        log.info("boomerang: the %s has no %s; sending single %s calls",
                                 self.rpc.service, self.rpc.batch_name, self.rpc.single_name)
                    self.batched = False
                    singly.extend(chunk)
                elif err.code in TRANSIENT_CODES or self.rpc.whole_call_answers(err):
                    answers.extend((item, err) for item in chunk)  # as each call alone would have failed
                else:
                    log.warning("boomerang: the %s refused a %s of %d (%s); sending them singly",
                                self.rpc.service, self.rpc.batch_name, len(chunk), err)
                    singly.extend(chunk)
                continue
            if len(resp.results) != len(chunk):
                bad = BoomerangClientError(self.rpc.batch_name, BoomerangError(
                    Code.INTERNAL, "INTERNAL", f"{len(resp.results)} results for {len(chunk)} items"))
                answers.extend((item, bad) for item in chunk)
                continue
            for item, one in zip(chunk, resp.results, strict=True):
                answers.append((item, one.response if not one.error_code else self._item_error(one)))
        if singly:
            answers.extend(self._singly(singly))
        return answers

    def _item_error(self, one: Any) -> BoomerangClientError:
        """One failed item of a batch, as its own single call would have raised it."""
        return BoomerangClientError(self.rpc.single_name,
                                    from_code_number(one.error_code, one.error_reason, one.error_message))
