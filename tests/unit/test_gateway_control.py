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
