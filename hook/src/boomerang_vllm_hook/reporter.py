"""The prefill side's background reports: how each planned turn went, told to the router.

ReportTurn closes a plan (the router counts unreported plans as engine load) and settles a
PULL plan's claim. The hook reports `HANDLE_USE_READ` once vLLM allocated the request with
the handle (the NixlConnector then reads it, or tells D to free it), and
`HANDLE_USE_UNKNOWN` otherwise — never `NOT_READ` for a handle vLLM has seen, because a
handle given back after D freed its blocks would hand the next turn garbage. The router
treats UNKNOWN as read: the worst case is one lost reuse.

A plan whose answer never arrived (the deadline passed while the router worked) may still
hold a claim. The reporter asks again with the same `request_id`, which returns the same
plan or at least the same claimed handle, and reports it `HANDLE_USE_NOT_READ`: this engine
certainly never saw that handle, so the lease goes back to the conversation.

The thread (`outbox.OutboxWorker`) drains up to `batch_size` reports a round and sends them
as one ReportTurnBatch; the router settles them together and answers each report on its own.
A report refused (an unknown plan, a bad report) is dropped and counted by reason. A lost plan
to give back (`replan`) is planned again first, in the same round, and its report joins the
batch. Retries are safe: a report is idempotent on its `plan_id`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRouterClient, result
from boomerang.resilience import TRANSIENT_CODES
from boomerang.v1 import router_service_pb2 as opb

from boomerang_vllm_hook.outbox import Entry, OutboxWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """One ReportTurn to send, or (with `replan`) a lost plan to find and give back."""

    tenant: str
    plan_id: str = ""
    handle_use: int = opb.HANDLE_USE_UNSPECIFIED
    replan: opb.PlanTurnRequest | None = None
    delivered_cached_tokens: int | None = None  # the hook's count of prompt tokens not computed
    # Measured on P, for the router's cost models: allocation to finish (the pull's copy
    # included), and of that the copy (allocation to the NixlConnector's finished receive).
    prefill_seconds: float | None = None
    copy_seconds: float | None = None

    @classmethod
    def give_back(cls, tenant: str, plan: opb.PlanTurnResponse) -> Report:
        """The report that closes a plan vLLM never used: a PULL's handle goes back unread."""
        pulled = plan.decision == opb.PLAN_DECISION_PULL
        return cls(tenant, plan.plan_id, opb.HANDLE_USE_NOT_READ if pulled else opb.HANDLE_USE_UNSPECIFIED)


class TurnReporter(OutboxWorker[Report]):
    """Owns the thread that sends turn reports; `submit` never blocks."""

    rpc = "ReportTurnBatch"

    def __init__(
        self,
        client: SyncRouterClient,
        *,
        queue_size: int = 10_000,
        when_full: Literal["drop_oldest", "reject_new"] = "drop_oldest",
        batch_size: int = 64,
        rpc_timeout: float = 2.0,
        deadline: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__("boomerang-reporter", client, queue_size=queue_size, when_full=when_full,
                         batch_size=batch_size, rpc_timeout=rpc_timeout, clock=clock)
        self.deadline = deadline
        self.reported = 0
        self.given_back = 0

    def submit(self, report: Report) -> bool:
        """Queue a report; False when the full queue rejected it."""
        return self.outbox.offer(report, self.clock() + self.deadline)

    def snapshot(self) -> dict[str, Any]:
        """Counters for logs and tests."""
        return {**super().snapshot(), "reported": self.reported, "given_back": self.given_back}

    def _batch_future(self, chunk: list[Entry[Report]]) -> Any:
        request = opb.ReportTurnBatchRequest(reports=[_request(e.item) for e in chunk])
        return self.client.report_turn_batch_future(request, timeout=self.rpc_timeout)

    def _label(self, entry: Entry[Report]) -> str:
        return f"the report of plan {entry.item.plan_id}"

    def _accepted(self, entry: Entry[Report], response: Any) -> None:
        if entry.item.handle_use == opb.HANDLE_USE_NOT_READ:
            self.given_back += 1
        self.reported += 1

    def _ready(self, batch: list[Entry[Report]]) -> tuple[list[Entry[Report]], bool]:
        """Plan again every lost plan of the round (all in flight at once), so each has its
        report; returns the entries ready to report and False when a PlanTurn failed
        transiently."""
        calls = [(e, self.client.plan_turn_future(e.item.replan, timeout=self.rpc_timeout))
                 for e in batch if e.item.replan is not None]
        failed: list[Entry[Report]] = []
        for entry, future in calls:
            try:
                plan: opb.PlanTurnResponse = result("PlanTurn", future)
            except BoomerangClientError as err:
                if err.code in TRANSIENT_CODES:
                    self.transient_failures += 1
                    failed.append(entry)
                else:
                    self.rejected[err.reason] += 1
                    log.warning("boomerang: PlanTurn refused when giving back a lost plan: %s", err)
                continue
            # From here on the entry is a plain report: a retry sends it without planning again.
            entry.item = Report.give_back(entry.item.tenant, plan)
        ready = [e for e in batch if e.item.replan is None]  # the unplanned ones wait or are dropped
        if failed:
            self.outbox.retry(failed)
        return ready, not failed


def _request(report: Report) -> opb.ReportTurnRequest:
    """The ReportTurn message of a report (its plan found)."""
    req = opb.ReportTurnRequest(tenant=report.tenant, plan_id=report.plan_id, handle_use=report.handle_use)  # type: ignore[arg-type]
    if report.delivered_cached_tokens is not None:
        req.delivered_cached_tokens = report.delivered_cached_tokens
    if report.prefill_seconds is not None:
        req.prefill_seconds = report.prefill_seconds
        if report.copy_seconds is not None:
            req.copy_seconds = min(report.copy_seconds, report.prefill_seconds)
    return req
