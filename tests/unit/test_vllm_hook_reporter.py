"""The prefill hook's reporter: reports batched into ReportTurnBatch, answered one by one.

Against `FakeRouter`, which answers each report of a batch as ReportTurn would. Reports are
queued before the thread starts, so the first round takes them all at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from boomerang.v1 import router_service_pb2 as opb
from boomerang_vllm_hook.planner import Report, TurnReporter

from tests.support.hook_fakes import FakeRouter, client_error


def reports(n: int, prefix: str = "plan") -> list[Report]:
    return [Report("acme", f"{prefix}-{i}", opb.HANDLE_USE_READ, delivered_cached_tokens=16 * i) for i in range(n)]


@pytest.fixture
def router() -> FakeRouter:
    return FakeRouter()


@pytest.fixture
def started() -> Iterator[list[TurnReporter]]:
    running: list[TurnReporter] = []
    yield running
    for reporter in running:
        reporter.close(timeout=1.0)


def run(router: FakeRouter, started: list[TurnReporter], queued: list[Report], batch_size: int = 64) -> TurnReporter:
    """A reporter with `queued` waiting, started, and drained (within 5 s)."""
    reporter = TurnReporter(router, batch_size=batch_size, rpc_timeout=1.0)  # type: ignore[arg-type]
    for report in queued:
        assert reporter.submit(report)
    reporter.start()
    started.append(reporter)
    assert reporter.flush(5.0), reporter.snapshot()
    return reporter


def test_queued_reports_go_as_one_batch_each_answered(router: FakeRouter, started: list[TurnReporter]) -> None:
    reporter = run(router, started, reports(5))
    assert router.batches == [5]
    assert [r.plan_id for r in router.reports] == [f"plan-{i}" for i in range(5)]
    assert [r.delivered_cached_tokens for r in router.reports] == [0, 16, 32, 48, 64]
    assert all(r.handle_use == opb.HANDLE_USE_READ and r.tenant == "acme" for r in router.reports)
    snap = reporter.snapshot()
    assert (snap["reported"], snap["batch_calls"], snap["rejected"]) == (5, 1, {})


def test_a_round_takes_at_most_batch_size_reports(router: FakeRouter, started: list[TurnReporter]) -> None:
    run(router, started, reports(5), batch_size=2)
    assert router.batches == [2, 2, 1]
    assert [r.plan_id for r in router.reports] == [f"plan-{i}" for i in range(5)]


def test_per_report_errors_one_refused_one_retried_the_rest_answered(
    router: FakeRouter, started: list[TurnReporter]
) -> None:
    router.report_errors.extend([
        client_error("ReportTurn", "NOT_FOUND", "PLAN_NOT_FOUND"),  # plan-0: dropped, counted
        client_error("ReportTurn", "UNAVAILABLE", "REGISTRY_UNAVAILABLE"),  # plan-1: retried
    ])
    reporter = run(router, started, reports(3))
    assert router.batches == [3, 1]  # plan-1 alone in the second round
    assert [r.plan_id for r in router.reports] == ["plan-2", "plan-1"]
    snap = reporter.snapshot()
    assert snap["reported"] == 2 and snap["rejected"] == {"PLAN_NOT_FOUND": 1}
    assert snap["transient_failures"] == 1 and snap["retried"] == 1


def test_a_batch_failed_in_transit_is_retried_whole(router: FakeRouter, started: list[TurnReporter]) -> None:
    router.batch_errors.append(client_error("ReportTurnBatch", "UNAVAILABLE"))
    reporter = run(router, started, reports(3))
    assert router.batches == [3]  # the failed call is not an answered batch
    assert [r.plan_id for r in router.reports] == ["plan-0", "plan-1", "plan-2"]
    snap = reporter.snapshot()
    assert (snap["reported"], snap["transient_failures"], snap["batch_calls"]) == (3, 3, 2)


def test_a_batch_refused_whole_is_each_report_s_answer(router: FakeRouter, started: list[TurnReporter]) -> None:
    router.batch_errors.append(client_error("ReportTurnBatch", "PERMISSION_DENIED", "PERMISSION_DENIED"))
    reporter = run(router, started, reports(3))
    assert router.batches == [] and router.reports == []
    snap = reporter.snapshot()
    assert snap["reported"] == 0 and snap["rejected"] == {"PERMISSION_DENIED": 3} and snap["batch_calls"] == 1


def test_a_lost_plan_is_planned_again_and_given_back_in_the_batch(started: list[TurnReporter]) -> None:
    router = FakeRouter(lambda req: opb.PlanTurnResponse(plan_id=f"found-{req.request_id}",
                                                         decision=opb.PLAN_DECISION_PULL))
    router.errors.append(client_error("PlanTurn", "UNAVAILABLE"))  # the first replan fails in transit
    lost = [Report("acme", replan=opb.PlanTurnRequest(tenant="acme", request_id=f"r{i}")) for i in range(2)]
    reporter = run(router, started, [reports(1)[0], *lost])
    assert [p.request_id for p in router.plans] == ["r0", "r1", "r0"]
    by_plan = {r.plan_id: r.handle_use for r in router.reports}
    assert by_plan == {"plan-0": opb.HANDLE_USE_READ, "found-r1": opb.HANDLE_USE_NOT_READ,
                       "found-r0": opb.HANDLE_USE_NOT_READ}
    assert router.batches == [2, 1]  # plan-0 and r1's report together; r0's after its retry
    snap = reporter.snapshot()
    assert (snap["reported"], snap["given_back"], snap["transient_failures"]) == (3, 2, 1)


def test_a_lost_plan_the_router_refuses_is_counted_and_dropped(started: list[TurnReporter]) -> None:
    router = FakeRouter()
    router.errors.append(client_error("PlanTurn", "INVALID_ARGUMENT", "INVALID_REQUEST"))
    reporter = run(router, started, [Report("acme", replan=opb.PlanTurnRequest(tenant="acme", request_id="r"))])
    assert router.reports == [] and router.batches == []
    assert reporter.snapshot()["rejected"] == {"INVALID_REQUEST": 1}


def test_a_cold_lost_plan_is_reported_without_a_handle_use(started: list[TurnReporter]) -> None:
    router = FakeRouter()  # answers COLD
    reporter = run(router, started, [Report("acme", replan=opb.PlanTurnRequest(tenant="acme", request_id="r"))])
    assert [(r.plan_id, r.handle_use) for r in router.reports] == [("p-cold", opb.HANDLE_USE_UNSPECIFIED)]
    assert reporter.snapshot()["given_back"] == 0
