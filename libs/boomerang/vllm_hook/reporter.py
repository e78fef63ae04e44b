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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRouterClient
from boomerang.resilience import TRANSIENT_CODES, Backoff
from boomerang.v1 import router_service_pb2 as opb
from boomerang.vllm_hook.outbox import Entry, Outbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """One ReportTurn to send, or (with `replan`) a lost plan to find and give back."""

    tenant: str
    plan_id: str = ""
    handle_use: int = opb.HANDLE_USE_UNSPECIFIED
    replan: opb.PlanTurnRequest | None = None
    delivered_cached_tokens: int | None = None  # the hook's count of prompt tokens not computed


class TurnReporter:
    """Owns the thread that sends turn reports; `submit` never blocks."""

    def __init__(
        self,
        client: SyncRouterClient,
        *,
        queue_size: int = 10_000,
        when_full: Literal["drop_oldest", "reject_new"] = "drop_oldest",
        rpc_timeout: float = 2.0,
        deadline: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.client = client
        self.rpc_timeout = rpc_timeout
        self.deadline = deadline
        self.clock = clock
        self.outbox: Outbox[Report] = Outbox(queue_size, when_full, clock)
        self.reported = 0
        self.given_back = 0
        self.transient_failures = 0
        self.rejected: Counter[str] = Counter()
        self._busy = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="boomerang-reporter", daemon=True)

    def submit(self, report: Report) -> bool:
        """Queue a report; False when the full queue rejected it."""
        return self.outbox.offer(report, self.clock() + self.deadline)

    def start(self) -> None:
        """Start the background thread."""
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is queued or being sent."""
        end = time.monotonic() + timeout
        while (len(self.outbox) or self._busy) and time.monotonic() < end:
            time.sleep(0.005)
        return not (len(self.outbox) or self._busy)

    def close(self, timeout: float = 2.0) -> None:
        """Send what can be sent within `timeout`, then stop."""
        if self._thread.is_alive():
            self.flush(timeout)
        self._stop.set()
        self.outbox.close()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout + self.rpc_timeout + 1.0)
        self.client.close()

    def snapshot(self) -> dict[str, Any]:
        """Counters for logs and tests."""
        s = self.outbox.stats
        return {
            "queued": len(self.outbox),
            "reported": self.reported,
            "given_back": self.given_back,
            "transient_failures": self.transient_failures,
            "rejected": dict(self.rejected),
            "expired": s.expired,
            "dropped_full": s.dropped_full,
            "rejected_full": s.rejected_full,
        }

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            batch = self.outbox.take(1, timeout=0.5)
            if not batch:
                continue
            self._busy = True
            try:
                ok = self._send(batch[0])
            except Exception:
                log.exception("boomerang: report failed")
                ok = True
            finally:
                self._busy = False
            if ok:
                backoff.reset()
            else:
                self._stop.wait(backoff.next())

    def _send(self, entry: Entry[Report]) -> bool:
        report = entry.item
        try:
            plan_id = report.plan_id
            if report.replan is not None:
                plan = self.client.plan_turn(report.replan, timeout=self.rpc_timeout)
                plan_id = plan.plan_id
                if plan.decision != opb.PLAN_DECISION_PULL:
                    entry.item = Report(report.tenant, plan_id, opb.HANDLE_USE_UNSPECIFIED)
                else:
                    entry.item = Report(report.tenant, plan_id, opb.HANDLE_USE_NOT_READ)
                report = entry.item
            req = opb.ReportTurnRequest(tenant=report.tenant, plan_id=plan_id, handle_use=report.handle_use)  # type: ignore[arg-type]
            if report.delivered_cached_tokens is not None:
                req.delivered_cached_tokens = report.delivered_cached_tokens
            self.client.report_turn(req, timeout=self.rpc_timeout)
        except BoomerangClientError as err:
            if err.code in TRANSIENT_CODES:
                self.transient_failures += 1
                self.outbox.retry([entry])
                return False
            self.rejected[err.reason] += 1
            log.warning("boomerang: ReportTurn refused for plan %s: %s", report.plan_id, err)
            return True
        if report.handle_use == opb.HANDLE_USE_NOT_READ:
            self.given_back += 1
        self.reported += 1
        return True
