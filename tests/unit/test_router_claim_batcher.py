"""The router's claim batcher: coalescing, bounded queue, deadlines that count queue time."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_router.claims import QUEUE_FULL, QUEUE_TIMEOUT, ClaimBatcher, claim_reuse_batch
from boomerang_router.domain import ClaimResult
from boomerang_server.leases import ClaimOutcome


def answer(n: int) -> rpb.ClaimReuseResponse:
    """NO_LEASE, marked with the claim's number as its verified tokens."""
    return rpb.ClaimReuseResponse(outcome=rpb.CLAIM_OUTCOME_NO_LEASE, reusable_tokens=n)


def number(req: rpb.ClaimReuseRequest) -> int:
    return int(req.conversation_id[1:])


class FakeRegistry:
    """A registry client answering each claim NO_LEASE after `delay`; records each call's claims."""

    def __init__(self, delay: float = 0.0, fail_conversation: str = ""):
        self.delay = delay
        self.fail_conversation = fail_conversation
        self.calls: list[list[str]] = []
        self.methods: list[str] = []
        self.timeouts: list[float] = []
        self.sent_at: list[float] = []  # the loop's time at each call

    async def wait(self, timeout: float) -> None:
        """The delay, cut at the call's deadline as gRPC cuts it."""
        self.timeouts.append(timeout)
        self.sent_at.append(asyncio.get_running_loop().time())
        if self.delay > timeout:
            await asyncio.sleep(timeout)
            raise BoomerangClientError("ClaimReuse", BoomerangError(Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", "late"))
        await asyncio.sleep(self.delay)

    async def claim_reuse(
        self, req: rpb.ClaimReuseRequest, timeout: float
    ) -> rpb.ClaimReuseResponse:
        self.calls.append([req.conversation_id])
        self.methods.append("ClaimReuse")
        await self.wait(timeout)
        return answer(number(req))

    async def claim_reuse_batch(
        self, req: rpb.ClaimReuseBatchRequest, timeout: float
    ) -> rpb.ClaimReuseBatchResponse:
        reqs = req.claims
        self.calls.append([r.conversation_id for r in reqs])
        self.methods.append("ClaimReuseBatch")
        await self.wait(timeout)
        return rpb.ClaimReuseBatchResponse(results=[
            rpb.ClaimReuseBatchResult(error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                      error_reason="INVALID_REQUEST", error_message="bad")
            if r.conversation_id == self.fail_conversation
            else rpb.ClaimReuseBatchResult(response=answer(number(r)))
            for r in reqs
        ])


def req(n: int) -> rpb.ClaimReuseRequest:
    return rpb.ClaimReuseRequest(tenant="t", conversation_id=f"c{n}", claim_id=f"k{n}")


async def test_claims_arriving_while_one_call_is_out_leave_together() -> None:
    api = FakeRegistry(delay=0.02)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    results = await asyncio.gather(*(batcher.claim_in_batch(req(n), 1.0) for n in range(11)))
    assert [r.verified_tokens for r in results] == list(range(11))  # each its own answer
    assert api.calls == [["c0"], [f"c{n}" for n in range(1, 11)]]


async def test_batches_are_capped_and_calls_in_flight_bounded() -> None:
    api = FakeRegistry(delay=0.01)
    batcher = ClaimBatcher(api, max_batch=4, in_flight=2, queue_max=100)  # type: ignore[arg-type]
    await asyncio.gather(*(batcher.claim_in_batch(req(n), 1.0) for n in range(14)))
    assert [len(c) for c in api.calls] == [1, 1, 4, 4, 4]
    assert sorted(c for call in api.calls for c in call) == sorted(f"c{n}" for n in range(14))


async def test_a_claim_queued_past_its_deadline_is_never_sent() -> None:
    api = FakeRegistry(delay=0.2)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    first = asyncio.ensure_future(batcher.claim_in_batch(req(0), 0.05))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(batcher.claim_in_batch(req(1), 0.05))
    with pytest.raises(BoomerangClientError) as late:
        await first
    assert late.value.code == "DEADLINE_EXCEEDED"  # it was sent: it may have committed
    with pytest.raises(BoomerangClientError) as shed:
        await queued
    assert shed.value.code == "RESOURCE_EXHAUSTED" and shed.value.reason == QUEUE_TIMEOUT
    await asyncio.sleep(0.25)
    assert api.calls == [["c0"]]  # the expired claim never left
    assert batcher.sending == 0 and not batcher.queue


async def test_a_full_queue_answers_at_once() -> None:
    api = FakeRegistry(delay=0.05)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=2)  # type: ignore[arg-type]
    waiting = [asyncio.ensure_future(batcher.claim_in_batch(req(n), 1.0)) for n in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(BoomerangClientError) as full:
        await batcher.claim_in_batch(req(9), 1.0)
    assert full.value.reason == QUEUE_FULL
    assert len(await asyncio.gather(*waiting)) == 3


async def test_one_bad_claim_fails_alone() -> None:
    api = FakeRegistry(delay=0.01, fail_conversation="c2")
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    results = await asyncio.gather(*(batcher.claim_in_batch(req(n), 1.0) for n in range(4)), return_exceptions=True)
    assert isinstance(results[2], BoomerangClientError) and results[2].code == "INVALID_ARGUMENT"
    assert [r.verified_tokens for r in results if isinstance(r, ClaimResult)] == [0, 1, 3]


async def test_a_failed_call_fails_every_claim_in_it() -> None:
    class Down(FakeRegistry):
        async def claim_reuse_batch(self, req, timeout):  # type: ignore[no-untyped-def]
            raise BoomerangClientError("ClaimReuseBatch", BoomerangError(Code.UNAVAILABLE, "UNAVAILABLE", "down"))

    api = Down(delay=0.01)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    results = await asyncio.gather(*(batcher.claim_in_batch(req(n), 1.0) for n in range(5)), return_exceptions=True)
    assert isinstance(results[0], ClaimResult)
    assert all(isinstance(r, BoomerangClientError) and r.code == "UNAVAILABLE" for r in results[1:])


async def test_a_call_carries_its_most_urgent_claim_s_deadline() -> None:
    api = FakeRegistry(delay=0.05)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    first = asyncio.ensure_future(batcher.claim_in_batch(req(0), 1.0))
    await asyncio.sleep(0)
    queued = asyncio.get_running_loop().time()
    urgent = asyncio.ensure_future(batcher.claim_in_batch(req(1), 0.5))
    await asyncio.sleep(0.01)
    relaxed = asyncio.ensure_future(batcher.claim_in_batch(req(2), 5.0))
    await asyncio.gather(first, urgent, relaxed)
    assert api.calls == [["c0"], ["c1", "c2"]]
    # The second call's deadline is what the urgent claim had left when it left: bounded by
    # the times the test saw, not by a guess of how long the first call took (a busy machine
    # stretched its 50 ms sleep past the old 0.1 s floor).
    assert 0.5 - (api.sent_at[1] - queued) <= api.timeouts[1] <= 0.5, (api.timeouts, api.sent_at, queued)


async def test_a_patient_claim_leaves_with_patient_claims_only() -> None:
    """A long prompt's claim may wait longer than the claim deadline (patient); sent with
    short claims its call would carry their deadline, so it goes with its own kind, first in
    line for the next call, and keeps its own deadline."""
    api = FakeRegistry(delay=0.05)
    batcher = ClaimBatcher(api, max_batch=64, in_flight=1, queue_max=100)  # type: ignore[arg-type]
    first = asyncio.ensure_future(batcher.claim_in_batch(req(0), 1.0))
    await asyncio.sleep(0)
    # Short claims of 0.5 s: ample for the first call's 50 ms on a busy machine.
    short = [asyncio.ensure_future(batcher.claim_in_batch(req(n), 0.5)) for n in (1, 2)]
    patient = [asyncio.ensure_future(batcher.claim_in_batch(req(n), 5.0, patient=True)) for n in (3, 4)]
    short.append(asyncio.ensure_future(batcher.claim_in_batch(req(5), 0.5)))
    await asyncio.gather(first, *short, *patient)
    assert api.calls == [["c0"], ["c1", "c2", "c5"], ["c3", "c4"]]
    assert api.timeouts[1] <= 0.5 and api.timeouts[2] > 4.5


async def test_a_batch_answer_s_failed_item_is_the_error_its_claim_alone_would_raise() -> None:
    class Client:
        async def claim_reuse_batch(self, request: rpb.ClaimReuseBatchRequest, timeout: float) -> rpb.ClaimReuseBatchResponse:
            return rpb.ClaimReuseBatchResponse(results=[
                rpb.ClaimReuseBatchResult(response=rpb.ClaimReuseResponse(outcome=rpb.CLAIM_OUTCOME_NO_LEASE)),
                rpb.ClaimReuseBatchResult(error_code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                                          error_reason="ENGINE_NOT_REGISTERED", error_message="no such engine"),
                rpb.ClaimReuseBatchResult(error_code=grpc.StatusCode.UNAVAILABLE.value[0],
                                          error_reason="DATABASE_UNAVAILABLE", error_message="retry later"),
            ])

    client: Any = Client()
    ok, refused, down = await claim_reuse_batch(client, [req(0), req(1), req(2)], 1.0)
    assert isinstance(ok, ClaimResult) and ok.status is ClaimOutcome.NO_LEASE
    assert isinstance(refused, BoomerangClientError) and isinstance(down, BoomerangClientError)
    assert (refused.code, refused.reason, refused.error.message) == ("FAILED_PRECONDITION", "ENGINE_NOT_REGISTERED", "no such engine")
    assert (down.code, down.reason) == ("UNAVAILABLE", "DATABASE_UNAVAILABLE")
