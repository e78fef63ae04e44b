"""Group commit for turn ends: many RPCs, one transaction, acknowledged after commit.

A registration's cost is dominated by its commit (a WAL flush). Handlers put their
registration, or a whole turn end (CompleteTurn: a claim to settle and a registration,
turns.py), in a queue and wait; a few workers each take everything queued (up to
`max_batch`), run them in one transaction and commit once, then answer every
waiting handler. Nothing is acknowledged before its commit. If the batch transaction fails
as a whole (a deadlock with another replica, a lost connection), each registration is
retried alone, so one bad apple never fails its neighbours; a part whose own outcome is
an error (stale generation, an expired claim, …) gets that error and the rest commit.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from boomerang.errors import BoomerangError

from boomerang_registry.domain import RetainedBlocks
from boomerang_registry.metrics import BATCH_SIZE
from boomerang_registry.registrations import Registered
from boomerang_registry.turns import TurnEnd, TurnEnded, TurnStore

log = logging.getLogger(__name__)
Result = Registered


@dataclass
class _Pending:
    turn: TurnEnd
    future: asyncio.Future[TurnEnded] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RegistrationBatcher:
    """Batches registrations and turn ends (`TurnStore.commit`) into shared transactions."""

    def __init__(self, turns: TurnStore, max_batch: int = 256, workers: int = 2):
        self.turns = turns
        self.max_batch = max_batch
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.workers = workers
        self.tasks: list[asyncio.Task[None]] = []
        self.batch_sizes: list[int] = []  # recent sizes, for metrics and tests

    def start(self) -> None:
        """Start the workers on the running loop."""
        self.tasks = [asyncio.create_task(self._work(), name=f"group-commit-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        """Finish what is queued, then stop the workers."""
        await self.queue.join()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def register(self, request: RetainedBlocks) -> Result:
        """Register through the next batch; returns after the batch committed."""
        outcome = (await self.end_turn(TurnEnd(registration=request))).registration
        if isinstance(outcome, BoomerangError):
            raise outcome
        assert outcome is not None
        return outcome

    async def end_turn(self, turn: TurnEnd) -> TurnEnded:
        """Settle and register a turn's end through the next batch; returns after its commit."""
        pending = _Pending(turn)
        await self.queue.put(pending)
        return await pending.future

    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                await self._commit(batch)
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def _commit(self, batch: list[_Pending]) -> None:
        self.batch_sizes = (self.batch_sizes + [len(batch)])[-1000:]
        BATCH_SIZE.observe(len(batch))
        try:
            # One multi-row statement for the batch (more only where one conversation
            # registers twice in it), then the one commit.
            outcomes = await self.turns.commit([item.turn for item in batch])
        except Exception:
            log.warning("group commit of %d turn ends failed; retrying one by one", len(batch), exc_info=True)
            await asyncio.gather(*(self._alone(item) for item in batch))
            return
        for item, outcome in zip(batch, outcomes, strict=True):
            _settle(item.future, outcome)

    async def _alone(self, item: _Pending) -> None:
        try:
            (outcome,) = await self.turns.commit([item.turn])
            _settle(item.future, outcome)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting RPC to translate
            if not item.future.done():
                item.future.set_exception(exc)


def _settle(future: asyncio.Future[Any], outcome: TurnEnded) -> None:
    if not future.done():
        future.set_result(outcome)
