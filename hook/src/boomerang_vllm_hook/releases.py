"""Releases on the decode engine: freeing a retained turn nobody will pull, through vLLM's own
expiry path.

vLLM 0.33.0's pull connector frees a finished turn's blocks on D when its send deadline
passes: `request_finished` puts `perf_counter() + decoder_kv_blocks_ttl` in the scheduler's
`_reqs_need_send`; the next `build_connector_meta` hands it to the workers as
`reqs_to_send` (with `scheduler_clock`) and clears the map; each worker's `start_load_kv`
rebases the deadline onto its clock and overwrites its `_reqs_to_send` entry (for requests
it still holds, `_reqs_to_process`); `get_finished` → `_reap_expired_send_leases` returns
the expired ones as `finished_sending`, and the scheduler frees their blocks. A release
puts `perf_counter()` (now) in `_reqs_need_send` for the request just before
`build_connector_meta`: vLLM sends it, the worker overwrites the deadline with one already
past, and its next `get_finished` frees the blocks. tests/vllm checks this against vLLM's
own code.

The registry's answer arrives on the sender's background thread; the scheduler thread
applies it at its next `build_connector_meta` (`take`), so nothing ever waits on it. Only
requests this hook registered and vLLM has not freed yet are released: vLLM's scheduler
asserts that a request it is told finished sending is still in flight, so a release for a
request already read (or already reaped) must never reach it.
"""

from __future__ import annotations

import queue
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

MAX_PINNED = 200_000


class ReleaseInbox:
    """Releases received on any thread, applied on the scheduler thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock  # perf_counter: vLLM's clock for send deadlines
        self.counters: Counter[str] = Counter()
        self._incoming: queue.SimpleQueue[str] = queue.SimpleQueue()
        # Requests whose blocks vLLM holds for a pull: their send deadline and their number of
        # blocks (scheduler thread).
        self._pinned: OrderedDict[str, tuple[float, int]] = OrderedDict()
        # Free and total KV blocks as the scheduler thread last saw them (read by heartbeats).
        self.free_blocks = 0
        self.total_blocks = 0

    # -- any thread ----------------------------------------------------------------------

    def receive(self, request_ids: Iterable[str]) -> None:
        """The registry's releases (the sender's thread); never blocks."""
        for rid in request_ids:
            self._incoming.put(rid)
            self.counters["releases_received"] += 1

    def memory(self) -> tuple[int, int]:
        """(free KV blocks, total KV blocks) for the heartbeat; (0, 0) when unknown."""
        return self.free_blocks, self.total_blocks

    # -- the scheduler thread ------------------------------------------------------------

    def pin(self, request_id: str, expiry: float, blocks: int) -> None:
        """vLLM holds this finished request's blocks until `expiry` (on `clock`) or a read."""
        self._pinned[request_id] = expiry, blocks
        while len(self._pinned) > MAX_PINNED:
            self._pinned.popitem(last=False)

    def freed(self, request_ids: Iterable[str]) -> None:
        """vLLM reported these requests' blocks freed (`finished_sending`)."""
        for rid in request_ids:
            self._pinned.pop(rid, None)

    def take(self) -> list[str]:
        """The released requests vLLM still holds: the ones to expire now."""
        if self._incoming.empty():
            return []
        now = self.clock()
        out: list[str] = []
        while True:
            try:
                rid = self._incoming.get_nowait()
            except queue.Empty:
                break
            held = self._pinned.get(rid)
            if held is None:
                self.counters["releases_not_held"] += 1  # read, reaped, or never ours
                continue
            expiry, blocks = held
            if expiry <= now:
                self.counters["releases_already_due"] += 1  # vLLM reaps it this step anyway
                continue
            self._pinned[rid] = now, blocks
            self.counters["releases_applied"] += 1
            self.counters["released_blocks"] += blocks
            out.append(rid)
        return out
