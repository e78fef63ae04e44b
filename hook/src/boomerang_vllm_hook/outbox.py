"""A bounded, thread-safe queue between vLLM's scheduler thread and a background sender.

`offer` never blocks: when the queue is full it either drops the oldest entry (the one
closest to its deadline, and so the least valuable) or rejects the new one, and counts it.
The sender `take`s batches, `retry`s failed entries at the front (keeping their order), and
entries past their deadline are dropped on the way out and counted.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")


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

    def wait_drained(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds (wall clock) until nothing is `pending`; whether it
        drained. What a sender's `flush` waits for."""
        end = time.monotonic() + timeout
        while self.pending() and time.monotonic() < end:
            time.sleep(0.005)
        return not self.pending()

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
    """The daemon thread that drains an outbox over a client: `start`, `flush`, `close`.

    A subclass sets `outbox`, `client` and `rpc_timeout` and writes `_run`, which loops until
    `_stop` is set.
    """

    outbox: Outbox[T]
    client: Any  # closed with the worker
    rpc_timeout: float

    def __init__(self, thread_name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start the background thread."""
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is queued or being sent; whether that happened in time."""
        return self.outbox.wait_drained(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Send what can be sent within `timeout`, then stop the thread and close the client."""
        if self._thread.is_alive():
            self.flush(timeout)
        self._stop.set()
        self.outbox.close()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout + self.rpc_timeout + 1.0)
        self.client.close()
