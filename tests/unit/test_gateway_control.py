"""The control plane never costs a request: a dead router answers None fast, then is skipped."""

from __future__ import annotations

import asyncio
import socket
import time

from boomerang.clients.router import RouterClient
from boomerang_gateway.control import ControlPlane, Report


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_dead_router_degrades_within_the_deadline_then_backs_off() -> None:
    router = RouterClient(f"127.0.0.1:{closed_port()}", timeout=0.3, plan_timeout=0.2)
    outcomes: list[str] = []
    control = ControlPlane(router, plan_timeout=0.2, report_timeout=0.3, backoff=30.0, on_report=outcomes.append)
    try:
        t = time.monotonic()
        assert await control.plan("t", "c", "m", [1, 2, 3]) is None
        assert time.monotonic() - t < 0.6
        assert not control.available()  # backing off: the next turns do not even ask
        t = time.monotonic()
        assert await control.plan("t", "c", "m", [1, 2, 3]) is None
        assert time.monotonic() - t < 0.01
        control.report_later(Report("t", "0190f3c2-0000-7000-8000-000000000000", "c", "READ", None, [], [], time.time()))
        assert control.pending_reports == 1
        await control.drain(2.0)
        assert outcomes == ["FAILED"] and control.pending_reports == 0
    finally:
        await router.close()


async def test_no_router_and_no_plan_id_send_nothing() -> None:
    control = ControlPlane(None, 0.1, 0.1, 1.0)
    assert not control.available()
    assert await control.plan("t", "c", "m", [1]) is None
    control.report_later(Report("t", "", "c", "READ", None, [], [], 0.0))
    assert control.pending_reports == 0


async def test_the_next_plan_of_a_conversation_waits_for_its_report() -> None:
    router = RouterClient(f"127.0.0.1:{closed_port()}", timeout=0.3, plan_timeout=0.3)
    control = ControlPlane(router, plan_timeout=0.3, report_timeout=0.3, backoff=0.0)
    try:
        control.report_later(Report("t", "0190f3c2-0000-7000-8000-000000000000", "c", "READ", None, [], [], 0.0))
        report = next(iter(control._reports))
        await control.plan("t", "c", "m", [1])
        assert report.done()  # the plan started only after the report ended
        await asyncio.sleep(0)
        assert control._pending == {}
    finally:
        await router.close()


async def test_a_failure_gets_a_fresh_channel_for_the_next_attempt() -> None:
    made: list[RouterClient] = []

    def factory() -> RouterClient:
        made.append(RouterClient(f"127.0.0.1:{closed_port()}", timeout=0.2, plan_timeout=0.2))
        return made[-1]

    control = ControlPlane(factory(), plan_timeout=0.2, report_timeout=0.2, backoff=0.0, reconnect=factory)
    assert await control.plan("t", "c", "m", [1]) is None  # fails on the first client
    assert await control.plan("t", "c", "m", [1]) is None  # asks again on a new one
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


async def test_settle_waits_for_the_answer_then_counts_it_committed() -> None:
    control = ControlPlane(_SlowRouter(0.05), 0.2, 1.0, 0.0, commit_timeout=1.0)  # type: ignore[arg-type]
    task = control.report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))
    outcome, waited = await control.settle(task)
    assert outcome == "committed" and 0.04 <= waited < 0.5
    assert task is not None and task.done()


async def test_settle_is_bounded_and_the_report_goes_on_in_the_background() -> None:
    outcomes: list[str] = []
    control = ControlPlane(_SlowRouter(0.4), 0.2, 2.0, 0.0, on_report=outcomes.append,  # type: ignore[arg-type]
                           commit_timeout=0.1)
    task = control.report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))
    t = time.monotonic()
    outcome, _ = await control.settle(task)
    assert outcome == "timed_out" and time.monotonic() - t < 0.3
    await control.drain(2.0)
    assert outcomes == ["REGISTERED"]  # it still landed, after the turn had ended


async def test_settle_reports_a_failure_and_zero_means_no_wait() -> None:
    failing = ControlPlane(_SlowRouter(0.0, fail=True), 0.2, 1.0, 0.0, commit_timeout=1.0)  # type: ignore[arg-type]
    assert (await failing.settle(failing.report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))))[0] == "failed"
    off = ControlPlane(_SlowRouter(0.3), 0.2, 1.0, 0.0, commit_timeout=0.0)  # type: ignore[arg-type]
    t = time.monotonic()
    assert await off.settle(off.report_later(Report("t", PLAN_ID, "c", "READ", None, [], [], 0.0))) == ("none", 0.0)
    assert time.monotonic() - t < 0.05
    await off.drain(1.0)
    assert await off.settle(None) == ("none", 0.0)
