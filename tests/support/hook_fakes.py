"""Scripted stand-ins for the blocking registry and router clients, for the hook's unit tests.

They answer like the real services do at the client boundary (responses, or
`BoomerangClientError` with the registry's reasons), and record every call.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
from boomerang import leasekeys
from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as opb
from boomerang.v1 import types_pb2 as tpb


def client_error(method: str, code: str, reason: str = "") -> BoomerangClientError:
    """The error a client raises for `code` (and a reason, defaulting to the code)."""
    return BoomerangClientError(method, BoomerangError(Code(code), reason or code, f"{code} from a fake"))


class Done:
    """A finished `grpc.Future`: a response or an error."""

    def __init__(self, value: Any = None, error: Exception | None = None, log: list[str] | None = None):
        self.value, self.error, self.log = value, error, log

    def result(self, timeout: float | None = None) -> Any:
        if self.log is not None:
            self.log.append("result")
        if self.error is not None:
            raise self.error
        return self.value


class _KeysStream:
    """A blocking stream's surface: yields its messages, then waits until cancelled."""

    def __init__(self, *messages: rpb.WatchLeaseKeysResponse):
        self.messages = list(messages)
        self.cancelled = threading.Event()

    def __iter__(self) -> Any:
        yield from self.messages
        self.cancelled.wait()

    def cancel(self) -> None:
        self.cancelled.set()


class FakeRegistry:
    """SyncRegistryClient's surface. `script` maps a method to a queue of errors (or None
    for success) consumed one per call; `hold` blocks RegisterRetainedBlocks while set.

    RegisterRetainedBlocksBatch answers each registration as RegisterRetainedBlocks would, in
    one result each (a scripted RegisterRetainedBlocks error becomes that registration's
    result); its own script fails the whole call. `registrations` records every registration
    sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        self.script: dict[str, deque[Exception | None]] = {}
        self.leases: dict[tuple[str, int, str], rpb.RegisterRetainedBlocksRequest] = {}
        self.generation: int | None = None
        self.hold = threading.Event()
        self.closed = False
        self.events: list[str] = []  # "issue" / "result" of RegisterRetainedBlocks(Batch) futures
        self.registrations: list[rpb.RegisterRetainedBlocksRequest] = []
        # WatchLeaseKeys: None has no such RPC (the hook's summary never gets ready); a list of
        # keys is streamed as one snapshot, then the stream stays open until cancelled.
        self.lease_keys: list[int] | None = None

    def watch_lease_keys(self, watcher: str) -> Any:
        """WatchLeaseKeys: `lease_keys` as a snapshot, then nothing until `cancel()`."""
        if self.lease_keys is None:
            raise AttributeError("watch_lease_keys")
        return _KeysStream(rpb.WatchLeaseKeysResponse(snapshot=True, snapshot_complete=True,
                                                      keys=leasekeys.pack(self.lease_keys)))

    def fail(self, method: str, *errors: Exception | None) -> None:
        """Make the next calls of `method` fail with these errors (None means succeed)."""
        self.script.setdefault(method, deque()).extend(errors)

    def _next(self, method: str, req: Any) -> None:
        with self.lock:
            self.calls.append((method, req))
            queue = self.script.get(method)
            error = queue.popleft() if queue else None
        if error is not None:
            raise error

    def names(self) -> list[str]:
        """The methods called, in order."""
        return [name for name, _ in self.calls]

    def register_engine(self, req: rpb.RegisterEngineRequest, timeout: float | None = None) -> rpb.RegisterEngineResponse:
        self._next("RegisterEngine", req)
        self.generation = req.engine.registration_generation
        return rpb.RegisterEngineResponse(engine=req.engine)

    def invalidate_engine(self, req: rpb.InvalidateEngineRequest, timeout: float | None = None) -> rpb.InvalidateEngineResponse:
        self._next("InvalidateEngine", req)
        return rpb.InvalidateEngineResponse()

    def heartbeat(self, req: rpb.HeartbeatRequest, timeout: float | None = None) -> rpb.HeartbeatResponse:
        self._next("Heartbeat", req)
        return rpb.HeartbeatResponse(engine=tpb.Engine(engine_id=req.engine_id))

    def _hold(self) -> None:
        deadline = time.monotonic() + 10
        while self.hold.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)

    def _register(self, req: rpb.RegisterRetainedBlocksRequest) -> rpb.RegisterRetainedBlocksResponse:
        with self.lock:
            self.registrations.append(req)
            queue = self.script.get("RegisterRetainedBlocks")
            error = queue.popleft() if queue else None
        if error is not None:
            raise error
        if self.generation is not None and req.engine_generation != self.generation:
            reason = "STALE_GENERATION" if req.engine_generation < self.generation else "GENERATION_NOT_REGISTERED"
            raise client_error("RegisterRetainedBlocks", "FAILED_PRECONDITION", reason)
        key = (req.engine_id, req.engine_generation, req.remote_request_id)
        created = key not in self.leases
        self.leases.setdefault(key, req)
        return rpb.RegisterRetainedBlocksResponse(lease=tpb.Lease(remote_request_id=req.remote_request_id), created=created)

    def register_retained_blocks_batch_future(
        self, req: rpb.RegisterRetainedBlocksBatchRequest, timeout: float | None = None
    ) -> Done:
        self.events.append("issue")
        self._hold()
        try:
            self._next("RegisterRetainedBlocksBatch", req)
        except BoomerangClientError as err:
            return Done(error=err, log=self.events)
        results = []
        for item in req.registrations:
            try:
                results.append(rpb.RegisterRetainedBlocksBatchResult(response=self._register(item)))
            except BoomerangClientError as err:
                results.append(rpb.RegisterRetainedBlocksBatchResult(
                    error_code=grpc.StatusCode[err.code].value[0], error_reason=err.reason, error_message=str(err)
                ))
        return Done(rpb.RegisterRetainedBlocksBatchResponse(results=results), log=self.events)

    def close(self) -> None:
        self.closed = True


class FakeRouter:
    """SyncRouterClient's surface. `planner` makes PlanTurn answers; `delay` sleeps (bounded
    by the call's timeout, then DEADLINE_EXCEEDED, as gRPC would).

    ReportTurnBatch answers each report as ReportTurn would, one result each (an error from
    `report_errors` becomes that report's result); `batch_errors` fail whole calls. `reports`
    records every report answered; `batches` the size of every batch call."""

    def __init__(self, planner: Callable[[opb.PlanTurnRequest], opb.PlanTurnResponse] | None = None):
        self.planner = planner or (lambda req: opb.PlanTurnResponse(plan_id="p-cold", decision=opb.PLAN_DECISION_COLD))
        self.delay = 0.0
        self.errors: deque[Exception] = deque()
        self.report_errors: deque[Exception] = deque()
        self.plans: list[opb.PlanTurnRequest] = []
        self.reports: list[opb.ReportTurnRequest] = []
        self.batch_errors: deque[Exception] = deque()
        self.batches: list[int] = []
        self.closed = False

    def plan_turn(self, req: opb.PlanTurnRequest, timeout: float | None = None) -> opb.PlanTurnResponse:
        self.plans.append(req)
        if self.delay:
            if timeout is not None and self.delay >= timeout:
                time.sleep(timeout)
                raise client_error("PlanTurn", "DEADLINE_EXCEEDED")
            time.sleep(self.delay)
        if self.errors:
            raise self.errors.popleft()
        return self.planner(req)

    def plan_turn_future(self, req: opb.PlanTurnRequest, timeout: float | None = None) -> concurrent.futures.Future[Any]:
        """PlanTurn as gRPC's future: answered at once, or (with `delay`) on a thread of its own."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def answer() -> None:
            try:
                future.set_result(self.plan_turn(req, timeout))
            except Exception as exc:  # noqa: BLE001 - handed to the future, as gRPC does
                future.set_exception(exc)

        if self.delay:
            threading.Thread(target=answer, daemon=True).start()
        else:
            answer()
        return future

    def report_turn(self, req: opb.ReportTurnRequest, timeout: float | None = None) -> opb.ReportTurnResponse:
        if self.report_errors:
            raise self.report_errors.popleft()
        self.reports.append(req)
        return opb.ReportTurnResponse(plan_id=req.plan_id)

    def report_turn_batch_future(self, req: opb.ReportTurnBatchRequest, timeout: float | None = None) -> Done:
        if self.batch_errors:
            return Done(error=self.batch_errors.popleft())
        self.batches.append(len(req.reports))
        results = []
        for item in req.reports:
            try:
                results.append(opb.ReportTurnBatchResult(response=self.report_turn(item, timeout)))
            except BoomerangClientError as err:
                results.append(opb.ReportTurnBatchResult(
                    error_code=grpc.StatusCode[err.code].value[0], error_reason=err.reason, error_message=str(err)
                ))
        return Done(opb.ReportTurnBatchResponse(results=results))

    def close(self) -> None:
        self.closed = True
