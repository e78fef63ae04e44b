"""The control plane never costs a request: a dead router answers None fast, then is skipped."""

from __future__ import annotations

import asyncio
import socket
import time

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.router import RouterClient
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang_gateway.control import SLOW_PLANS_TO_BACK_OFF, ControlPlane, Report


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_dead_router_degrades_within_the_deadline_then_backs_off() -> None:
    # A refused connection answers UNAVAILABLE at once, but a busy machine took longer than a
    # 0.2 s deadline to say so, and DEADLINE_EXCEEDED (a slow router, not a dead one) does not
    # back off: the deadline is 1 s, far beyond a refusal, and the bounds follow it.
    router = RouterClient(f"127.0.0.1:{closed_port()}", timeout=1.0, plan_timeout=1.0)
    outcomes: list[str] = []
    control = ControlPlane(router, plan_timeout=1.0, report_timeout=1.0, backoff=30.0, on_report=outcomes.append)
    try:
        t = time.monotonic()
        assert await control.ask_router_for_plan("t", "c", "m", [1, 2, 3]) is None
        assert time.monotonic() - t < 1.5  # the plan deadline and its guard, whatever gRPC does
        assert not control.available()  # backing off: the next turns do not even ask
        t = time.monotonic()
        assert await control.ask_router_for_plan("t", "c", "m", [1, 2, 3]) is None
        assert time.monotonic() - t < 0.5  # no call: well inside the deadline a call would have
        control.send_report_later(Report("t", "0190f3c2-0000-7000-8000-000000000000", "c", "READ", None, [], [], time.time()))
        assert len(control._reports) == 1
        await control.drain(2.0)
        assert outcomes == ["FAILED"] and len(control._reports) == 0
    finally:
        await router.close()


class _ScriptedRouter:
    """Answers each PlanTurn with the next of `answers`: a gRPC code to fail with, or "" to plan."""

    def __init__(self, answers: list[str]):
        self.answers, self.calls = list(answers), 0

    async def plan_turn(self, req: object, timeout: float) -> rtpb.PlanTurnResponse:
        self.calls += 1
        code, _, reason = self.answers.pop(0).partition(":")
        if code:
            raise BoomerangClientError("PlanTurn", BoomerangError(Code(code), reason or code, "scripted"))
        return rtpb.PlanTurnResponse(decision=rtpb.PLAN_DECISION_COLD, kv_transfer_params_json="{}")

    async def close(self) -> None:
        pass


async def test_late_plans_back_off_only_when_late_in_a_row() -> None:
    """Under load one late plan must not take reuse from every turn: a late answer counts, an
    answer in between resets the count, and only SLOW_PLANS_TO_BACK_OFF in a row back off."""
    late = "DEADLINE_EXCEEDED"
    script = [late] * (SLOW_PLANS_TO_BACK_OFF - 1) + [""] + [late] * SLOW_PLANS_TO_BACK_OFF
    router = _ScriptedRouter(script)
    control = ControlPlane(router, plan_timeout=0.2, report_timeout=0.2, backoff=30.0)  # type: ignore[arg-type]
    for _ in range(SLOW_PLANS_TO_BACK_OFF - 1):
        assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
        assert control.available()
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is not None  # answered: the count starts over
    for _ in range(SLOW_PLANS_TO_BACK_OFF - 1):
        assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
        assert control.available()
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
    assert not control.available() and router.calls == len(script)


async def test_an_error_about_one_request_never_backs_off() -> None:
    router = _ScriptedRouter(["INVALID_ARGUMENT", "PERMISSION_DENIED", "FAILED_PRECONDITION"] * SLOW_PLANS_TO_BACK_OFF)
    control = ControlPlane(router, plan_timeout=0.2, report_timeout=0.2, backoff=30.0)  # type: ignore[arg-type]
    for _ in range(3 * SLOW_PLANS_TO_BACK_OFF):
        assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
        assert control.available()


async def test_a_model_without_engines_at_the_router_backs_nothing_off() -> None:
    router = _ScriptedRouter(["UNAVAILABLE:NO_PREFILL_ENGINE", "UNAVAILABLE:NO_DECODE_ENGINE"] * SLOW_PLANS_TO_BACK_OFF)
    control = ControlPlane(router, plan_timeout=0.2, report_timeout=0.2, backoff=30.0)  # type: ignore[arg-type]
    for _ in range(2 * SLOW_PLANS_TO_BACK_OFF):
        assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
        assert control.available()


async def test_three_late_plans_back_off_and_the_next_ask_gets_a_fresh_channel() -> None:
    made: list[_ScriptedRouter] = []

    def factory() -> _ScriptedRouter:
        made.append(_ScriptedRouter(["DEADLINE_EXCEEDED"] * SLOW_PLANS_TO_BACK_OFF + [""]))
        return made[-1]

    control = ControlPlane(factory(), plan_timeout=0.2, report_timeout=0.2, backoff=0.0,  # type: ignore[arg-type]
                           reconnect=factory)  # type: ignore[arg-type]
    for _ in range(SLOW_PLANS_TO_BACK_OFF - 1):
        assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
    assert len(made) == 1  # late answers alone keep the channel
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None  # the third: back off, channel stale
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None  # asked on a new channel (which is late too)
    assert len(made) == 2 and control.router is made[1] and made[1].calls == 1
    await control.drain(1.0)


async def test_an_unreachable_router_backs_off_at_once() -> None:
    router = _ScriptedRouter(["UNAVAILABLE"])
    control = ControlPlane(router, plan_timeout=0.2, report_timeout=0.2, backoff=30.0)  # type: ignore[arg-type]
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
    assert not control.available()


async def test_no_router_and_no_plan_id_send_nothing() -> None:
    control = ControlPlane(None, 0.1, 0.1, 1.0)
    assert not control.available()
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None
    control.send_report_later(Report("t", "", "c", "READ", None, [], [], 0.0))
    assert len(control._reports) == 0


async def test_the_next_plan_of_a_conversation_waits_for_its_report() -> None:
    router = RouterClient(f"127.0.0.1:{closed_port()}", timeout=0.3, plan_timeout=0.3)
    control = ControlPlane(router, plan_timeout=0.3, report_timeout=0.3, backoff=0.0)
    try:
        control.send_report_later(Report("t", "0190f3c2-0000-7000-8000-000000000000", "c", "READ", None, [], [], 0.0))
        report = next(iter(control._reports))
        await control.ask_router_for_plan("t", "c", "m", [1])
        assert report.done()  # the plan started only after the report ended
        await asyncio.sleep(0)
        assert control._pending == {}
    finally:
        await router.close()


async def test_a_turns_own_plan_made_beside_its_decode_does_not_wait_for_its_report() -> None:
    """The report of a turn that started without a plan waits for the plan made beside it;
    that plan waiting in turn for the conversation's report in flight (its own) held the
    turn's lease back a whole plan timeout (first turns, seen across gateway replicas)."""
    router = RouterClient(f"127.0.0.1:{closed_port()}", timeout=0.3, plan_timeout=0.3)
    control = ControlPlane(router, plan_timeout=5.0, report_timeout=0.3, backoff=0.0)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def own_plan() -> None:
        await never

    try:
        control.send_report_later(Report("t", "", "c", "READ", None, [], [], 0.0,
                                         background_plan=asyncio.ensure_future(own_plan())))
        started = time.monotonic()
        assert await control.ask_router_for_plan("t", "c", "m", [1], turn_started=True) is None  # the router is down
        assert time.monotonic() - started < 2.0  # not the 5 s plan timeout behind the report
    finally:
        never.cancel()
        await router.close()


async def test_a_failure_gets_a_fresh_channel_for_the_next_attempt() -> None:
    made: list[RouterClient] = []

    def factory() -> RouterClient:
        # 1 s: the refusal must arrive as UNAVAILABLE (which asks for a fresh channel), not be
        # overtaken by the deadline on a busy machine (DEADLINE_EXCEEDED keeps the channel).
        made.append(RouterClient(f"127.0.0.1:{closed_port()}", timeout=1.0, plan_timeout=1.0))
        return made[-1]

    control = ControlPlane(factory(), plan_timeout=1.0, report_timeout=1.0, backoff=0.0, reconnect=factory)
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None  # fails on the first client
    assert await control.ask_router_for_plan("t", "c", "m", [1]) is None  # asks again on a new one
    assert len(made) == 2 and control.router is made[1]
    await control.drain(1.0)


class _SlowRouter:
    """Answers ReportTurn after `delay` seconds (or fails at once with `fail`)."""

    def __init__(self, delay: float, fail: bool = False):
        self.delay, self.fail, self.calls = delay, fail, 0

    async def report_turn(self, req: object, timeout: float) -> object:
        from boomerang.v1 import router_service_pb2 as rtpb

        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("router refused")
        return rtpb.ReportTurnResponse(retention=rtpb.RETENTION_OUTCOME_REGISTERED)

    async def close(self) -> None:
        pass


PLAN_ID = "0190f3c2-0000-7000-8000-000000000000"


async def test_wait_for_report_waits_for_the_answer_then_counts_it_committed() -> None:
    control = ControlPlane(_SlowRouter(0.05), 0.2, 1.0, 0.0, commit_timeout=1.0)  # type: ignore[arg-type]
    task = control.send_report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))
    outcome, waited = await control.wait_for_report(task)
    assert outcome == "committed" and 0.04 <= waited < 0.5
    assert task is not None and task.done()


async def test_wait_for_report_is_bounded_and_the_report_goes_on_in_the_background() -> None:
    outcomes: list[str] = []
    control = ControlPlane(_SlowRouter(0.4), 0.2, 2.0, 0.0, on_report=outcomes.append,  # type: ignore[arg-type]
                           commit_timeout=0.1)
    task = control.send_report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))
    t = time.monotonic()
    outcome, _ = await control.wait_for_report(task)
    assert outcome == "timed_out" and time.monotonic() - t < 0.3
    await control.drain(2.0)
    assert outcomes == ["REGISTERED"]  # it still landed, after the turn had ended


async def test_wait_for_report_says_a_failure_and_zero_means_no_wait() -> None:
    failing = ControlPlane(_SlowRouter(0.0, fail=True), 0.2, 1.0, 0.0, commit_timeout=1.0)  # type: ignore[arg-type]
    assert (await failing.wait_for_report(failing.send_report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))))[0] == "failed"
    off = ControlPlane(_SlowRouter(0.3), 0.2, 1.0, 0.0, commit_timeout=0.0)  # type: ignore[arg-type]
    t = time.monotonic()
    assert await off.wait_for_report(off.send_report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))) == ("none", 0.0)
    assert time.monotonic() - t < 0.05
    await off.drain(1.0)
    assert await off.wait_for_report(None) == ("none", 0.0)


class _RecordingRouter:
    """Keeps every PlanTurn and ReportTurn request."""

    def __init__(self) -> None:
        self.plans: list[rtpb.PlanTurnRequest] = []
        self.reports: list[rtpb.ReportTurnRequest] = []

    async def plan_turn(self, req: rtpb.PlanTurnRequest, timeout: float) -> rtpb.PlanTurnResponse:
        self.plans.append(req)
        return rtpb.PlanTurnResponse(decision=rtpb.PLAN_DECISION_COLD, kv_transfer_params_json="{}")

    async def report_turn(self, req: rtpb.ReportTurnRequest, timeout: float) -> rtpb.ReportTurnResponse:
        self.reports.append(req)
        return rtpb.ReportTurnResponse()

    async def close(self) -> None:
        pass


async def test_the_cache_salt_reaches_plan_and_report_and_a_long_one_its_digest() -> None:
    router = _RecordingRouter()
    control = ControlPlane(router, 1.0, 1.0, 0.0)  # type: ignore[arg-type]
    plan_id = "0190f3c2-0000-7000-8000-000000000000"
    for salt in ("s-1", "", "x" * 300):
        await control.ask_router_for_plan("t", "", "m", [1, 2], cache_salt=salt)
        control.send_report_later(Report("t", plan_id, "", "READ", None, [], [], 0.0, cache_salt=salt))
    await control.drain(1.0)
    long_key = router.plans[2].cache_salt
    assert [p.cache_salt for p in router.plans[:2]] == ["s-1", ""]
    assert long_key.startswith("sha256:") and len(long_key) == 71  # within the router's 256
    assert [r.cache_salt for r in router.reports] == [p.cache_salt for p in router.plans]


async def test_prefill_on_decode_is_asked_for_only_when_on_and_the_measured_times_are_reported() -> None:
    router = _RecordingRouter()
    plan_id = "0190f3c2-0000-7000-8000-000000000000"
    for on in (False, True):
        control = ControlPlane(router, 1.0, 1.0, 0.0, prefill_on_decode=on)  # type: ignore[arg-type]
        await control.ask_router_for_plan("t", "c", "m", [1, 2])
        control.send_report_later(Report("t", plan_id, "c", "READ", None, [], [], 0.0,
                                         prefill_seconds=0.25 if on else None, inter_token_seconds=0.02 if on else None,
                                         decode_first_token_seconds=0.07 if on else None))
        await control.drain(1.0)
    assert [p.can_prefill_on_decode for p in router.plans] == [False, True]
    assert [r.HasField("prefill_seconds") for r in router.reports] == [False, True]
    assert (router.reports[1].prefill_seconds, router.reports[1].inter_token_seconds,
            router.reports[1].decode_first_token_seconds) == (0.25, 0.02, 0.07)
