"""The decode side's background sender, against a scripted registry client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_vllm_hook.requestview import RetainedHandle, TurnContext
from boomerang_vllm_hook.sender import (
    EngineFacts,
    Registration,
    RegistrationSender,
    idempotency_key,
)

from tests.support.hook_fakes import FakeRegistry, client_error
from tests.support.procs import wait_for

FACTS = EngineFacts("d-1", "decode", "qwen3-32b", 16, 480, 64, "127.0.0.1", 5600, generation=1)


def registration(rid: str, tokens: int = 40, generation: int | None = 1, conversation: str = "c") -> Registration:
    handle = RetainedHandle("d-1", rid, ((1, 2, 3),), "127.0.0.1", 5600, tokens, None, generation)
    return Registration(TurnContext("acme", conversation), handle, tuple(range(100, 100 + tokens)), 1_700_000_000.0)


@pytest.fixture
def fake() -> FakeRegistry:
    return FakeRegistry()


@pytest.fixture
def make(fake: FakeRegistry) -> Iterator[Any]:
    made: list[RegistrationSender] = []

    def build(**kwargs: Any) -> RegistrationSender:
        opts: dict[str, Any] = {"heartbeat_interval": 30.0, "rpc_timeout": 1.0, **kwargs}
        sender = RegistrationSender(fake, FACTS, **opts)  # type: ignore[arg-type]
        made.append(sender)
        return sender

    yield build
    for sender in made:
        sender.close(0.5)


def far() -> float:
    return time.perf_counter() + 600


def test_engine_first_then_the_lease(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    sender.submit(registration("r1"), far())
    sender.start()
    assert sender.flush(5)
    assert wait_for(lambda: sender.registered == 1, 5)
    assert fake.names()[:3] == ["InvalidateEngine", "RegisterEngine", "RegisterRetainedBlocksBatch"]
    inval = fake.calls[0][1]
    assert inval.engine_id == "d-1" and inval.reason == "ENGINE_RESTARTED" and inval.below_generation == 0
    eng = fake.calls[1][1].engine
    assert (eng.engine_id, eng.registration_generation, eng.block_size, eng.kv_blocks_ttl_seconds) == ("d-1", 1, 16, 480)
    (req,) = fake.calls[2][1].registrations
    chain = build_chain(list(range(100, 140)), 16)
    assert (req.tenant, req.conversation_id, req.engine_id, req.engine_generation) == ("acme", "c", "d-1", 1)
    assert req.num_tokens == 40 and req.token_chain.block_hashes == chain.block_hashes
    assert req.token_chain.tail_hash == chain.tail_hash and req.token_chain.block_size == 16
    assert [list(g.block_ids) for g in req.block_groups] == [[1, 2, 3]]
    assert req.finish_time_unix == 1_700_000_000.0 and req.model == "qwen3-32b"
    assert req.request_id == idempotency_key("d-1", 1, "r1") == idempotency_key("d-1", 1, "r1")
    assert idempotency_key("d-1", 2, "r1") != req.request_id


def batch_calls(fake: FakeRegistry) -> list[list[str]]:
    """The remote request ids of each RegisterRetainedBlocksBatch call, in order."""
    return [[r.remote_request_id for r in req.registrations] for name, req in fake.calls if name == "RegisterRetainedBlocksBatch"]


def test_a_batch_goes_as_one_call(fake: FakeRegistry, make: Any) -> None:
    sender = make(batch_size=8)
    for i in range(8):
        sender.submit(registration(f"r{i}"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 8, 5)
    assert batch_calls(fake) == [[f"r{i}" for i in range(8)]]
    assert "RegisterRetainedBlocks" not in fake.names()
    assert fake.events == ["issue", "result"]
    snap = sender.snapshot()
    assert snap["batch_calls"] == 1


def test_a_batch_past_the_registry_limit_goes_as_calls_in_flight_at_once(fake: FakeRegistry, make: Any) -> None:
    sender = make(batch_size=300)
    for i in range(300):
        sender.submit(registration(f"r{i}"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 300, 5)
    assert [len(call) for call in batch_calls(fake)] == [256, 44]
    assert fake.events[:3] == ["issue", "issue", "result"]


def test_each_registration_of_a_batch_is_answered_alone(fake: FakeRegistry, make: Any) -> None:
    fake.fail(
        "RegisterRetainedBlocks",
        None,
        client_error("RegisterRetainedBlocks", "UNAVAILABLE"),
        client_error("RegisterRetainedBlocks", "INVALID_ARGUMENT", "TOKEN_CHAIN_INVALID"),
        None,
    )
    sender = make()
    for i in range(4):
        sender.submit(registration(f"r{i}"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 3, 5)
    assert sender.snapshot()["rejected"] == {"TOKEN_CHAIN_INVALID": 1}
    assert batch_calls(fake) == [["r0", "r1", "r2", "r3"], ["r1"]]  # only the transient one again
    assert {k[2] for k in fake.leases} == {"r0", "r1", "r3"}


def test_a_batch_failing_whole_and_transiently_is_retried_whole(fake: FakeRegistry, make: Any) -> None:
    fake.fail("RegisterRetainedBlocksBatch", client_error("RegisterRetainedBlocksBatch", "UNAVAILABLE"))
    sender = make()
    for i in range(3):
        sender.submit(registration(f"r{i}"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 3, 5)
    assert batch_calls(fake) == [["r0", "r1", "r2"]] * 2
    assert sender.snapshot()["transient_failures"] == 3 and len(fake.registrations) == 3


def test_a_batch_refused_whole_is_each_registration_s_answer(fake: FakeRegistry, make: Any) -> None:
    fake.fail("RegisterRetainedBlocksBatch", client_error("RegisterRetainedBlocksBatch", "PERMISSION_DENIED"))
    sender = make()
    for i in range(2):
        sender.submit(registration(f"r{i}"), far())
    sender.start()
    assert wait_for(lambda: sender.snapshot()["rejected"] == {"PERMISSION_DENIED": 2}, 5)
    assert sender.registered == 0 and fake.registrations == []
    sender.submit(registration("r2"), far())
    assert wait_for(lambda: sender.registered == 1, 5)
    assert batch_calls(fake)[-1] == ["r2"]


def test_transient_failures_are_retried_once_acknowledged(fake: FakeRegistry, make: Any) -> None:
    unavailable = client_error("RegisterRetainedBlocks", "UNAVAILABLE")
    fake.fail("RegisterRetainedBlocks", unavailable, unavailable, client_error("RegisterRetainedBlocks", "DEADLINE_EXCEEDED"))
    sender = make()
    sender.submit(registration("r1"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 1, 5)
    snap = sender.snapshot()
    assert snap["transient_failures"] == 3 and snap["retried"] == 3
    assert len(fake.leases) == 1


def test_engine_unknown_to_the_registry_is_registered_again(fake: FakeRegistry, make: Any) -> None:
    fake.fail("RegisterRetainedBlocks", client_error("RegisterRetainedBlocks", "FAILED_PRECONDITION", "ENGINE_NOT_REGISTERED"))
    sender = make()
    sender.submit(registration("r1"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 1, 5)
    assert fake.names().count("RegisterEngine") == 2
    assert fake.names().count("InvalidateEngine") == 1  # only at the first registration


def test_newer_generation_registers_the_engine_at_it_first(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    sender.start()
    assert wait_for(lambda: sender.presence.registered, 5)
    sender.submit(registration("r2", generation=2), far())
    assert wait_for(lambda: sender.registered == 1, 5)
    engines = [req.engine.registration_generation for name, req in fake.calls if name == "RegisterEngine"]
    assert engines == [1, 2] and sender.presence.generation == 2
    # A handle from before the re-registration is dead: dropped, never sent.
    sender.submit(registration("r-old", generation=1), far())
    assert wait_for(lambda: sender.stale == 1, 5)
    assert ("d-1", 1, "r-old") not in fake.leases


def test_permanent_refusals_are_dropped_and_counted(fake: FakeRegistry, make: Any) -> None:
    fake.fail("RegisterRetainedBlocks", client_error("RegisterRetainedBlocks", "ALREADY_EXISTS", "REQUEST_ALREADY_REGISTERED"))
    sender = make()
    sender.submit(registration("r1"), far())
    sender.submit(registration("r2"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 1, 5)
    assert sender.snapshot()["rejected"] == {"REQUEST_ALREADY_REGISTERED": 1}
    assert len(fake.registrations) == 2 and batch_calls(fake) == [["r1", "r2"]]  # not retried


def test_repeat_of_a_landed_registration_counts_as_duplicate(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    sender.submit(registration("r1"), far())
    sender.submit(registration("r1"), far())  # e.g. the gateway's report raced the hook
    sender.start()
    assert wait_for(lambda: sender.registered + sender.duplicates == 2, 5)
    assert (sender.registered, sender.duplicates, len(fake.leases)) == (1, 1, 1)


def test_gives_up_at_the_blocks_expiry(fake: FakeRegistry, make: Any) -> None:
    for _ in range(100):
        fake.fail("RegisterRetainedBlocks", client_error("RegisterRetainedBlocks", "UNAVAILABLE"))
    sender = make()
    sender.submit(registration("r1"), time.perf_counter() + 0.3)
    sender.start()
    assert wait_for(lambda: sender.outbox.stats.expired == 1, 5)
    assert sender.registered == 0 and len(sender.outbox) == 0


def test_submit_never_blocks_and_the_bound_holds(fake: FakeRegistry, make: Any) -> None:
    fake.hold.set()  # the registry hangs on the first call
    sender = make(queue_size=10, batch_size=1)
    sender.start()
    assert wait_for(lambda: sender.presence.registered, 5)
    start = time.perf_counter()
    results = [sender.submit(registration(f"r{i}"), far()) for i in range(1000)]
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    assert all(results)
    snap = sender.snapshot()
    assert snap["queued"] <= 10 and snap["dropped_full"] >= 989
    fake.hold.clear()
    assert wait_for(lambda: len(sender.outbox) == 0, 5)
    # The newest ten survived (drop-oldest).
    assert wait_for(lambda: {"r999", "r990"} <= {k[2] for k in fake.leases}, 5)


def test_reject_new_policy(fake: FakeRegistry, make: Any) -> None:
    sender = make(queue_size=2, when_full="reject_new")
    assert [sender.submit(registration(f"r{i}"), far()) for i in range(3)] == [True, True, False]
    assert sender.snapshot()["rejected_full"] == 1


def test_heartbeats_carry_the_load(fake: FakeRegistry, make: Any) -> None:
    sender = make(heartbeat_interval=0.05, load=lambda: (3, 700))
    sender.start()
    assert wait_for(lambda: sender.presence.heartbeats >= 2, 5)
    beat = next(req for name, req in fake.calls if name == "Heartbeat")
    assert (beat.engine_id, beat.registration_generation, beat.in_flight_requests, beat.queued_prompt_tokens) == ("d-1", 1, 3, 700)


def test_heartbeat_unknown_engine_triggers_registration(fake: FakeRegistry, make: Any) -> None:
    sender = make(heartbeat_interval=0.05)
    fake.fail("Heartbeat", client_error("Heartbeat", "NOT_FOUND", "ENGINE_NOT_FOUND"))
    sender.start()
    assert wait_for(lambda: fake.names().count("RegisterEngine") == 2, 5)


def test_registry_down_at_start_registers_when_it_returns(fake: FakeRegistry, make: Any) -> None:
    fake.fail("InvalidateEngine", *[client_error("InvalidateEngine", "UNAVAILABLE")] * 3)
    sender = make()
    sender.submit(registration("r1"), far())
    sender.start()
    assert wait_for(lambda: sender.registered == 1, 10)
    assert sender.presence.failures == 3


def test_superseded_engine_registers_nothing(fake: FakeRegistry, make: Any) -> None:
    fake.fail("RegisterEngine", client_error("RegisterEngine", "FAILED_PRECONDITION", "STALE_GENERATION"))
    sender = make()
    sender.submit(registration("r1"), far())
    sender.start()
    assert wait_for(lambda: sender.snapshot()["rejected"].get("ENGINE_SUPERSEDED") == 1, 5)
    assert not fake.registrations and "RegisterRetainedBlocksBatch" not in fake.names()
    assert sender.flush(5)  # the dropped turn is not left pending


def test_bad_tokens_are_rejected_not_retried(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    bad = registration("r1")
    bad = Registration(bad.context, bad.handle, (2**32,) * 40, bad.finish_time_unix)
    sender.submit(bad, far())
    sender.start()
    assert wait_for(lambda: sender.snapshot()["rejected"].get("BAD_TOKENS") == 1, 5)


def test_close_flushes_and_closes_the_channel(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    sender.start()
    sender.submit(registration("r1"), far())
    sender.close(5)
    assert sender.registered == 1 and fake.closed


class Gate:
    """A point where the sender's thread waits until the test opens it; `reached` says it is there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def stop_here(self) -> None:
        self.reached.set()
        self.opened.wait(10)  # bounded, so a failed test still lets the thread finish


def test_flush_waits_for_a_round_taken_but_not_yet_sent(fake: FakeRegistry, make: Any, monkeypatch: Any) -> None:
    """The thread empties the queue when it takes a round, before it sends it: flush must not
    answer "nothing left" then, nor while the call is out (it did between the take and the
    round being marked in flight, so a close could stop the thread with the round in hand)."""
    sender = make()
    after_take, in_call = Gate(), Gate()
    take, batch_future = sender.outbox.take, fake.register_retained_blocks_batch_future

    def take_then_stop(max_items: int, timeout: float) -> Any:
        batch = take(max_items, timeout)
        if batch and not after_take.reached.is_set():
            after_take.stop_here()
        return batch

    def call_then_stop(req: rpb.RegisterRetainedBlocksBatchRequest, timeout: float | None = None) -> Any:
        in_call.stop_here()
        return batch_future(req, timeout)

    monkeypatch.setattr(sender.outbox, "take", take_then_stop)
    monkeypatch.setattr(fake, "register_retained_blocks_batch_future", call_then_stop)
    sender.submit(registration("r1"), far())
    sender.start()
    try:
        assert after_take.reached.wait(5)
        assert len(sender.outbox) == 0 and not sender.flush(0)  # queue empty, round unsent
        after_take.opened.set()
        assert in_call.reached.wait(5)
        assert not sender.flush(0)
        in_call.opened.set()
        assert sender.flush(5) and sender.registered == 1  # done means answered, not just taken
    finally:
        after_take.opened.set()
        in_call.opened.set()


def test_a_turn_without_a_conversation_is_registered_with_where_its_prompt_ended(fake: FakeRegistry, make: Any) -> None:
    sender = make()
    reg = registration("r9", tokens=40, conversation="")
    salted = Registration(TurnContext("acme", "", "s-1", 21), reg.handle, reg.token_ids, reg.finish_time_unix)
    sender.submit(salted, far())
    sender.start()
    assert sender.flush(5) and wait_for(lambda: sender.registered == 1, 5)
    (req,) = next(c for name, c in fake.calls if name == "RegisterRetainedBlocksBatch").registrations
    assert (req.conversation_id, req.prompt_tokens) == ("", 21)
    assert list(req.prompt_tail_token_ids) == list(range(116, 121))  # tokens 16..20: the prompt's partial block
    assert req.token_chain.block_hashes == build_chain(list(range(100, 140)), 16, "s-1").block_hashes
