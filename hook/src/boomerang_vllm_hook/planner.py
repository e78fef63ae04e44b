"""The prefill side's link to the router: plans fetched in the background, never inside
vLLM's scheduler step, and the turns' reports.

`get_num_new_matched_tokens` runs on the scheduler thread, and vLLM's scheduler is
synchronous: anything it waits for stalls every request on the engine. So the scheduler
thread only *starts* a plan (`PrefillPlanner.begin`: a deque append under a lock) and then
reads, on later calls, whether the answer is in (`PendingPlan.take`). One daemon thread,
`boomerang-planner`, builds each prompt's token chain and sends PlanTurn as a gRPC future;
the answer lands on a gRPC thread, which files it in the `PendingPlan`. Nothing on the
scheduler thread touches the network, and many plans are in flight at once.

Each plan has a wait: the time after which the scheduler stops holding the request back and
computes it locally (`plans.worth_waiting`, at most `plan_deadline_ms`). The PlanTurn call
carries that wait as its deadline, so the router sizes its claim to it.

An answer that arrives after the scheduler gave up (or after the request ended) is *late*:
whoever sees it second hands it to `on_late`, which gives back what it claimed. The race
between "the scheduler gives up" and "the answer arrives" is settled under the plan's lock,
so exactly one side acts on each answer.

After `breaker_failures` failed plans in a row the breaker opens and requests skip planning
for a pause (doubling from `breaker_cooldown_seconds` up to 30 s) before one tries again.

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

The reporter's thread (`TurnReporter`, an `outbox.OutboxWorker`) drains up to `batch_size`
reports a round and sends them as one ReportTurnBatch; the router settles them together and answers each report on its own.
A report refused (an unknown plan, a bad report) is dropped and counted by reason. A lost plan
to give back (`replan`) is planned again first, in the same round, and its report joins the
batch. Retries are safe: a report is idempotent on its `plan_id`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from boomerang import plans
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRouterClient, result
from boomerang.resilience import REFUSAL_CODES, TRANSIENT_CODES, CircuitBreaker
from boomerang.v1 import router_service_pb2 as opb

from boomerang_vllm_hook.outbox import Entry, OutboxWorker
from boomerang_vllm_hook.requestview import TurnContext

log = logging.getLogger(__name__)
MAX_COOLDOWN = 30.0
PLAN_NAMESPACE = uuid.UUID("5e1f0c2a-9d3b-4a7e-8f61-2b4c6d8e0a1f")
# A wait shorter than this cannot see an answer (one loopback round trip is longer): the
# request is not held back at all.
MIN_WAIT_SECONDS = 0.0005


def plan_breaker(failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> CircuitBreaker:
    """The planner's breaker: open after `failures` in a row, for a cooldown that doubles on each
    failed trial up to MAX_COOLDOWN."""
    return CircuitBreaker(failures, cooldown, growth=2.0, max_cooldown=MAX_COOLDOWN, clock=clock)


@dataclass
class PlanAttempt:
    """What one planning attempt produced: a plan, or why there is none."""

    response: opb.PlanTurnResponse | None
    error: str = ""  # a gRPC code name, `BAD_TOKENS`, `DEADLINE_SPENT` or an exception's name
    request: opb.PlanTurnRequest | None = None
    elapsed: float = 0.0  # seconds from `begin` to the answer


@dataclass
class PendingPlan:
    """One plan in flight: started on the scheduler thread, answered on another."""

    context: TurnContext
    prompt: Sequence[int]
    vllm_request_id: str
    started: float
    wait_until: float  # perf_counter time after which the scheduler computes locally
    on_late: Callable[[PendingPlan, PlanAttempt], None]
    cached: int = 0  # prompt tokens P's own prefix cache holds (vLLM's num_computed_tokens)
    attempt: PlanAttempt | None = None
    abandoned: bool = False
    # Nobody waits for it (the lease summary ruled the prompt out): it is sent all the same,
    # and its answer goes to `on_late` at once.
    beside: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> PlanAttempt | None:
        """The scheduler's read: the answer if it is in, else None (and nothing changes)."""
        with self._lock:
            return self.attempt

    def abandon(self) -> PlanAttempt | None:
        """The scheduler stops waiting. Returns the answer if it came in meanwhile (the caller
        settles it); otherwise the answer, when it comes, goes to `on_late`."""
        with self._lock:
            self.abandoned = True
            return self.attempt

    def resolve(self, attempt: PlanAttempt) -> None:
        """The answer arrived (any thread)."""
        with self._lock:
            if self.attempt is not None:
                return
            self.attempt = attempt
            late = self.abandoned
        if late:
            self.on_late(self, attempt)


class PrefillPlanner:
    """Starts plans without blocking and files their answers; never raises into vLLM."""

    def __init__(
        self,
        client: SyncRouterClient,
        *,
        engine_id: str,
        model: str,
        deadline: float,
        plan_with: Literal["chain", "tokens"],
        chain_block_size: int,
        breaker: CircuitBreaker,
        max_in_flight: int = 4096,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.client = client
        self.engine_id = engine_id
        self.model = model
        self.deadline = deadline
        self.plan_with = plan_with
        self.chain_block_size = chain_block_size
        self.breaker = breaker
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.in_flight = 0
        self.dropped_full = 0
        self._queue: deque[PendingPlan] = deque()
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="boomerang-planner", daemon=True)

    # -- the scheduler thread --------------------------------------------------------------

    def allow(self) -> bool:
        """Whether a plan may start now (the breaker is closed, or this is its trial)."""
        with self._lock:
            return self.breaker.allow()

    def begin(
        self, context: TurnContext, prompt: Sequence[int], vllm_request_id: str, wait: float,
        on_late: Callable[[PendingPlan, PlanAttempt], None], cached: int = 0, *, beside: bool = False,
    ) -> PendingPlan | None:
        """Start a plan that the scheduler waits for at most `wait` seconds (`beside`: that
        nobody waits for, answered to `on_late`); None when too many are in flight (the request
        computes locally). Never blocks."""
        now = self.clock()
        pending = PendingPlan(context, prompt, vllm_request_id, now, now + min(wait, self.deadline), on_late, cached,
                              abandoned=beside, beside=beside)
        with self._lock:
            if self.in_flight >= self.max_in_flight:
                self.dropped_full += 1
                return None
            self.in_flight += 1
            self._queue.append(pending)
            self._lock.notify()
        return pending

    # -- the planner thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the channel (calls in flight fail, their plans go late)."""
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self.client.close()

    def request_id(self, vllm_request_id: str) -> str:
        """The PlanTurn idempotency key (a UUID from engine and request id, so it fits the
        router's 128-character limit): asking again returns the same plan, or the same claim."""
        return str(uuid.uuid5(PLAN_NAMESPACE, f"{self.engine_id}\x00{vllm_request_id}"))

    def build_request(
        self, context: TurnContext, prompt: Sequence[int], vllm_request_id: str, cached: int = 0
    ) -> opb.PlanTurnRequest:
        """The PlanTurn request for this prompt (its chain, or its token ids), made for this
        engine and what its prefix cache holds (`cached`)."""
        req = plans.plan_request(
            context.tenant,
            context.conversation_id,
            self.model,
            prompt,
            request_id=self.request_id(vllm_request_id),
            salt=context.salt,
            chain_block_size=self.chain_block_size if self.plan_with == "chain" else 0,
        )
        req.prefill_cached_tokens = min(max(cached, 0), len(prompt))
        req.prefill_engine_id = self.engine_id
        return req

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._lock.wait()
                if self._stop:
                    pending_left = list(self._queue)
                    self._queue.clear()
                    break
                pending = self._queue.popleft()
            try:
                self._send(pending)
            except Exception as exc:
                log.exception("boomerang: starting a plan failed")
                self._finish(pending, type(exc).__name__)
        for pending in pending_left:
            self._finish(pending, "CANCELLED")

    def _send(self, pending: PendingPlan) -> None:
        if pending.abandoned and not pending.beside:  # the request ended (or gave up) before its plan left
            self._finish(pending, "DEADLINE_SPENT")
            return
        try:
            req = self.build_request(pending.context, pending.prompt, pending.vllm_request_id, pending.cached)
            req.turn_started = pending.beside
        except ValueError:
            self._finish(pending, "BAD_TOKENS")
            return
        left = pending.wait_until - self.clock()
        if left <= MIN_WAIT_SECONDS:
            self._finish(pending, "DEADLINE_SPENT", req)
            return
        future = self.client.plan_turn_future(req, timeout=left)
        future.add_done_callback(lambda f: self._answered(pending, req, f))

    def _answered(self, pending: PendingPlan, req: opb.PlanTurnRequest, future: Any) -> None:
        try:
            resp = result("PlanTurn", future)
        except BoomerangClientError as err:
            self._finish(pending, err.code, req, failed=err.code not in REFUSAL_CODES)
            return
        except Exception as exc:  # noqa: BLE001 - a cancelled future raises its own error class
            self._finish(pending, type(exc).__name__, req, failed=True)
            return
        self._finish(pending, "", req, resp)

    def _finish(
        self, pending: PendingPlan, error: str, req: opb.PlanTurnRequest | None = None,
        resp: opb.PlanTurnResponse | None = None, *, failed: bool = False,
    ) -> None:
        """File the attempt's outcome (a plan, or why there is none) and count it for the
        breaker: a plan closes it, a failure of the router (not a refusal) counts."""
        with self._lock:
            self.in_flight -= 1
            if failed:
                self.breaker.record_failure()
            elif resp is not None:
                self.breaker.record_success()
        pending.resolve(PlanAttempt(resp, error, req, self.clock() - pending.started))


@dataclass(frozen=True)
class Report:
    """One ReportTurn to send, or (with `replan`) a lost plan to find and give back."""

    tenant: str
    plan_id: str = ""
    handle_use: opb.HandleUse = opb.HANDLE_USE_UNSPECIFIED
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
    return plans.report_request(
        report.tenant, report.plan_id, report.handle_use,
        delivered_cached_tokens=report.delivered_cached_tokens,
        prefill_seconds=report.prefill_seconds, copy_seconds=report.copy_seconds,
    )
