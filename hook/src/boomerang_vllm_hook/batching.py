"""Many items in one call, with the answer each item would have had alone.

Both background senders of the hook send this way: the decode side's registrations
(RegisterRetainedBlocksBatch) and the prefill side's reports (ReportTurnBatch). A round's
items go out in calls of at most `MAX_CALL` (the services' limit), all in flight at once, and
come back as one answer per item, in order — the response, or the error that item alone was
refused with. An error of the whole call (transient, a permission, "register the engine
first") is each of its items' answer, and a response with the wrong number of results is an
INTERNAL error for each item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import result
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil.client_status import from_code_number

MAX_CALL = 256  # items per batched call: the registry's and the router's limit

E = TypeVar("E")
# What one item got back: its response, or the error it was refused with.
Answer = Any


@dataclass(frozen=True)
class BatchedRpc(Generic[E]):
    """A batched RPC, as a sender makes it for its items."""

    name: str  # e.g. "ReportTurnBatch"
    batch_future: Callable[[Sequence[E]], Any]  # one call of a chunk, in flight


class BatchedSender(Generic[E]):
    """Sends a round of items in calls of at most MAX_CALL, all in flight at once."""

    def __init__(self, rpc: BatchedRpc[E]):
        self.rpc = rpc
        self.batch_calls = 0

    def send(self, items: list[E]) -> list[tuple[E, Answer]]:
        """Each item with its answer, in order."""
        chunks = [items[n : n + MAX_CALL] for n in range(0, len(items), MAX_CALL)]
        calls = [(chunk, self.rpc.batch_future(chunk)) for chunk in chunks]
        self.batch_calls += len(calls)
        answers: list[tuple[E, Answer]] = []
        for chunk, future in calls:
            try:
                resp = result(self.rpc.name, future)
            except BoomerangClientError as err:
                answers.extend((item, err) for item in chunk)
                continue
            if len(resp.results) != len(chunk):
                bad = BoomerangClientError(self.rpc.name, BoomerangError(
                    Code.INTERNAL, "INTERNAL", f"{len(resp.results)} results for {len(chunk)} items"))
                answers.extend((item, bad) for item in chunk)
                continue
            for item, one in zip(chunk, resp.results, strict=True):
                answers.append((item, one.response if not one.error_code else self._item_error(one)))
        return answers

    def _item_error(self, one: Any) -> BoomerangClientError:
        """One failed item of a batch."""
        return BoomerangClientError(self.rpc.name, from_code_number(one.error_code, one.error_reason, one.error_message))
