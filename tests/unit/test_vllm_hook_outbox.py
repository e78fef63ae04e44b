"""The bounded queue between the scheduler thread and the sender."""

from __future__ import annotations

import threading
import time

from boomerang_vllm_hook.outbox import Outbox


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_drop_oldest_when_full() -> None:
    box: Outbox[int] = Outbox(3, "drop_oldest", Clock())
    assert all(box.offer(i, 1e9) for i in range(5))
    assert [e.item for e in box.take(10, 0)] == [2, 3, 4]
    assert box.stats.dropped_full == 2 and box.stats.offered == 5


def test_reject_new_when_full() -> None:
    box: Outbox[int] = Outbox(2, "reject_new", Clock())
    assert [box.offer(i, 1e9) for i in range(4)] == [True, True, False, False]
    assert [e.item for e in box.take(10, 0)] == [0, 1]
    assert box.stats.rejected_full == 2


def test_expired_entries_are_dropped_on_take() -> None:
    clock = Clock()
    box: Outbox[str] = Outbox(10, clock=clock)
    box.offer("soon", clock.now + 1)
    box.offer("later", clock.now + 10)
    clock.now += 5
    assert [e.item for e in box.take(10, 0)] == ["later"]
    assert box.stats.expired == 1


def test_retry_goes_back_to_the_front_in_order() -> None:
    box: Outbox[int] = Outbox(10, clock=Clock())
    for i in range(4):
        box.offer(i, 1e9)
    first = box.take(2, 0)
    box.offer(9, 1e9)
    box.retry(first)
    taken = box.take(10, 0)
    assert [e.item for e in taken] == [0, 1, 2, 3, 9]
    assert [e.attempts for e in taken[:2]] == [1, 1] and box.stats.retried == 2


def test_retry_respects_capacity() -> None:
    box: Outbox[int] = Outbox(2, clock=Clock())
    box.offer(0, 1e9)
    out = box.take(1, 0)
    box.offer(1, 1e9)
    box.offer(2, 1e9)
    box.retry(out)  # full meanwhile: the retried (oldest) entry is the one that goes
    assert [e.item for e in box.take(10, 0)] == [1, 2] and box.stats.dropped_full == 1


def test_take_waits_for_work_and_offer_never_blocks() -> None:
    box: Outbox[int] = Outbox(1)
    start = time.monotonic()
    assert box.take(1, 0.05) == [] and time.monotonic() - start >= 0.04
    got: list[int] = []
    t = threading.Thread(target=lambda: got.extend(e.item for e in box.take(1, 5)))
    t.start()
    time.sleep(0.02)
    start = time.monotonic()
    for i in range(1000):
        box.offer(i, 1e12)
    assert time.monotonic() - start < 0.5
    t.join(5)
    assert len(got) == 1


def test_close_releases_a_waiting_take() -> None:
    box: Outbox[int] = Outbox(1)
    t = threading.Thread(target=box.take, args=(1, 30))
    t.start()
    box.close()
    t.join(2)
    assert not t.is_alive()


def test_pending_counts_taken_entries_until_done() -> None:
    """What `flush` waits on: an entry taken is pending until its sender is done with it, so
    there is no moment between a take and its work when the queue looks empty."""
    box: Outbox[int] = Outbox(10)
    for i in range(3):
        box.offer(i, 1e12)
    taken = box.take(2, 0)
    assert len(box) == 1 and box.pending() == 3
    box.retry(taken[1:])  # one failed: back in the queue before the round is done
    box.done(len(taken))
    assert box.pending() == 2
    box.done(len(box.take(5, 0)))
    assert box.pending() == 0
