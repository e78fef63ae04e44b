"""The hook's two background senders' common part: a bounded queue and the thread draining it.

`Outbox` sits between vLLM's scheduler thread and a sender. `offer` never blocks: when the
queue is full it either drops the oldest entry (the one closest to its deadline, and so the
least valuable) or rejects the new one, and counts it. The sender `take`s batches, `retry`s
failed entries at the front (keeping their order), and entries past their deadline are
dropped on the way out and counted.

`OutboxWorker` is the sender's thread: the decode side's registrations
(RegisterRetainedBlocksBatch, `sender.py`) and the prefill side's reports (ReportTurnBatch,
`planner.py`). A round's items go out in calls of at most `MAX_CALL` (the services' limit),
all in flight at once, and come back as one answer per item, in order — the response, or
the error that item alone was refused with. An error of the whole call (transient, a
permission, "register the engine first") is each of its items' answer, and a response with
the wrong number of results is an INTERNAL error for each item. Each answer is then:

* a response — done (`_accepted`);
* transient (UNAVAILABLE, DEADLINE_EXCEEDED, …) — back to the front of the queue, then a
  growing pause (50 ms to 2 s) before the next round, until the entry's deadline;
* anything else — retried if the sender can fix its cause (`_fixable`), else dropped and
  counted by reason: retrying cannot help.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import result
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import from_code_number
from boomerang.resilience import TRANSIENT_CODES, Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_CALL = 256  # items per batched call: the registry's and the router's limit


@dataclass
class Entry(Generic[T]):
    """One queued item with its give-up time (on `clock`) and attempts so far."""

    item: T
    deadline: float
    attempts: int = 0
    # What the sender built from `item` on the first attempt, kept so retries do not rebuild it.
    prepared: Any = None


@dataclass
class OutboxStats:
    """Counters, read without the lock (each is a plain int)."""

    offered: int = 0
    dropped_full: int = 0
    rejected_full: int = 0
    expired: int = 0
    retried: int = 0


@dataclass
class Outbox(Generic[T]):
    """Bounded FIFO with drop-oldest or reject-new when full."""

    capacity: int
    when_full: Literal["drop_oldest", "reject_new"] = "drop_oldest"
    clock: Callable[[], float] = time.monotonic
    stats: OutboxStats = field(default_factory=OutboxStats)

    def __post_init__(self) -> None:
        self._items: deque[Entry[T]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._taken = 0  # entries taken and not yet marked `done`

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: T, deadline: float) -> bool:
        """Queue `item` until `deadline`; False when it was rejected because the queue is full."""
        with self._cond:
            self.stats.offered += 1
            if len(self._items) >= self.capacity:
                if self.when_full == "reject_new":
                    self.stats.rejected_full += 1
                    return False
                self._items.popleft()
                self.stats.dropped_full += 1
            self._items.append(Entry(item, deadline))
            self._cond.notify()
            return True

    def take(self, max_items: int, timeout: float) -> list[Entry[T]]:
        """Up to `max_items` live entries, waiting at most `timeout` seconds for the first."""
        out: list[Entry[T]] = []
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout)
            now = self.clock()
            while self._items and len(out) < max_items:
                entry = self._items.popleft()
                if entry.deadline <= now:
                    self.stats.expired += 1
                    continue
                out.append(entry)
            self._taken += len(out)
        return out

    def done(self, entries: int) -> None:
        """The sender finished with `entries` it took (after `retry`ing the failed ones)."""
        with self._cond:
            self._taken -= entries

    def pending(self) -> int:
        """Entries queued or taken and not yet `done`: 0 only when every offered entry was
        sent, dropped or put back and taken again (no gap between a `take` and its work)."""
        with self._cond:
            return len(self._items) + self._taken

    def retry(self, entries: list[Entry[T]]) -> None:
        """Put failed entries back at the front, in their order, within the capacity."""
        with self._cond:
            for entry in reversed(entries):
                entry.attempts += 1
                if len(self._items) >= self.capacity:
                    # The queue filled while they were out: they are the oldest, so they go.
                    if self.when_full == "reject_new":
                        self.stats.rejected_full += 1
                    else:
                        self.stats.dropped_full += 1
                    continue
                self._items.appendleft(entry)
                self.stats.retried += 1
            self._cond.notify()

    def close(self) -> None:
        """Stop making `take` wait (the sender is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class OutboxWorker(Generic[T]):
    """The daemon thread that drains an outbox in batched calls: `start`, `flush`, `close`.

    A subclass names its batched RPC (`rpc`) and writes `_batch_future` (one call of a chunk,
    in flight), `_accepted` (an item's response) and `_label`; it may override `_ready` (what
    of a round can go now), `_fixable` and `_wait`.
    """

    rpc = ""  # the batched RPC, e.g. "ReportTurnBatch"

    def __init__(
        self,
        thread_name: str,
        client: Any,
        *,
        queue_size: int,
        when_full: Literal["drop_oldest", "reject_new"],
        batch_size: int,
        rpc_timeout: float,
        clock: Callable[[], float],
    ):
        self.client = client  # closed with the worker
        self.batch_size = batch_size
        self.rpc_timeout = rpc_timeout
        self.clock = clock
        self.outbox: Outbox[T] = Outbox(queue_size, when_full, clock)
        self.transient_failures = 0
        self.rejected: Counter[str] = Counter()
        self.batch_calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        """Start the background thread."""
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds (wall clock) until nothing is queued or being sent
        (`Outbox.pending`); whether that happened in time."""
        end = time.monotonic() + timeout
        while self.outbox.pending() and time.monotonic() < end:
            time.sleep(0.005)
        return not self.outbox.pending()

    def close(self, timeout: float = 2.0) -> None:
        """Send what can be sent within `timeout`, then stop the thread and close the client."""
        if self._thread.is_alive():
            self.flush(timeout)
        self._stop.set()
        self.outbox.close()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout + self.rpc_timeout + 1.0)
        self.client.close()

    def snapshot(self) -> dict[str, Any]:
        """Counters for logs and tests."""
        s = self.outbox.stats
        return {
            "queued": len(self.outbox),
            "transient_failures": self.transient_failures,
            "rejected": dict(self.rejected),
            "batch_calls": self.batch_calls,
            "retried": s.retried,
            "expired": s.expired,
            "dropped_full": s.dropped_full,
            "rejected_full": s.rejected_full,
        }

    # -- the subclass's part ---------------------------------------------------------------

    def _batch_future(self, chunk: list[Entry[T]]) -> Any:
        raise NotImplementedError

    def _accepted(self, entry: Entry[T], response: Any) -> None:
        raise NotImplementedError

    def _label(self, entry: Entry[T]) -> str:
        """The entry, as a log line names it."""
        raise NotImplementedError

    def _ready(self, batch: list[Entry[T]]) -> tuple[list[Entry[T]], bool]:
        """The entries of a round to send now, and False when getting them ready failed
        transiently (the rest are put back or dropped here)."""
        return batch, True

    def _fixable(self, err: BoomerangClientError) -> bool:
        """Whether a refusal is one this sender fixes before retrying."""
        return False

    def _wait(self) -> float | None:
        """How long a round may wait for work; None: no round now."""
        return 0.5

    # -- the background thread -------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                wait = self._wait()
                batch = self.outbox.take(self.batch_size, timeout=wait) if wait is not None else []
                if not batch:
                    continue
                try:
                    clean = self._send(batch)
                finally:
                    self.outbox.done(len(batch))  # after any retry put its entries back
                if clean:
                    backoff.reset()
                else:
                    self._stop.wait(backoff.next())
            except Exception:  # the thread must outlive any bug in one round
                log.exception("boomerang: %s round failed", self.rpc)
                self._stop.wait(backoff.next())

    def _send(self, batch: list[Entry[T]]) -> bool:
        """One round; True when nothing failed transiently."""
        ready, clean = self._ready(batch)
        again: list[Entry[T]] = []
        for entry, answer in self._call(ready):
            if not isinstance(answer, BoomerangClientError):
                self._accepted(entry, answer)
            elif answer.code in TRANSIENT_CODES:
                clean = False
                self.transient_failures += 1
                again.append(entry)
            elif self._fixable(answer):
                again.append(entry)
            else:
                self.rejected[answer.reason] += 1
                log.warning("boomerang: %s refused %s: %s", self.rpc, self._label(entry), answer)
        if again:
            self.outbox.retry(again)
        return clean

    def _call(self, items: list[Entry[T]]) -> list[tuple[Entry[T], Any]]:
        """Each item with its answer (its response, or the error it was refused with), in order."""
        chunks = [items[n : n + MAX_CALL] for n in range(0, len(items), MAX_CALL)]
        calls = [(chunk, self._batch_future(chunk)) for chunk in chunks]
        self.batch_calls += len(calls)
        answers: list[tuple[Entry[T], Any]] = []
        for chunk, future in calls:
            try:
                resp = result(self.rpc, future)
            except BoomerangClientError as err:
                answers.extend((item, err) for item in chunk)
                continue
            if len(resp.results) != len(chunk):
                bad = BoomerangClientError(self.rpc, BoomerangError(
                    Code.INTERNAL, "INTERNAL", f"{len(resp.results)} results for {len(chunk)} items"))
                answers.extend((item, bad) for item in chunk)
                continue
            for item, one in zip(chunk, resp.results, strict=True):
                if one.error_code:
                    error = from_code_number(one.error_code, one.error_reason, one.error_message)
                    answers.append((item, BoomerangClientError(self.rpc, error)))
                else:
                    answers.append((item, one.response))
        return answers
