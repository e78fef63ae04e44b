"""The hook's logic behind the three scheduler-side connector calls, free of vLLM imports.

`BoomerangHook` sees each call after (or, for planning, before) the NixlConnector's own:

* `before_match(request, num_computed_tokens)` — prefill engines: a request that names a
  conversation, carries no handle and could gain from a pull gets a plan, started in the
  background (`planner.py`); until it is in, or its worth-bounded wait is over, the answer
  is "ask again later" and vLLM schedules the other requests. A PULL plan's
  `kv_transfer_params` are then merged into `request.kv_transfer_params` so the
  NixlConnector pulls D's blocks.
* `after_alloc(request, num_external_tokens)` — notes that vLLM scheduled the request with
  its handle (from then on the handle counts as read).
* `on_finished(request, (delay_free, kv_transfer_params))` — decode engines: a bidirectional
  handle is queued for registration; prefill engines: the plan is reported, and the
  conversation is copied into P's returned params so it reaches D with them. It runs for
  every way a request ends (stopped, length-capped, aborted, freed while waiting), so the
  per-request state is released there; a preempted request is not ended (vLLM re-queues
  it), it only counts as waiting for allocation again.

None of it raises into vLLM and none of it waits on the network: plans, registrations,
heartbeats and reports all leave through background threads, and a full queue drops and
counts. A plan whose answer arrives after its request stopped waiting for it (gave up,
ended, was aborted) gives back what it claimed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from boomerang.clients.sync import SyncRegistryClient, SyncRouterClient
from boomerang.leasekeys import LeaseKeysThread, LeaseSummary, conversation_key
from boomerang.plans import decision_name, pull_params, reused_tokens, worth_waiting
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as opb

from boomerang_vllm_hook.config import HookConfig
from boomerang_vllm_hook.planner import (
    MIN_WAIT_SECONDS,
    PendingPlan,
    PlanAttempt,
    PrefillPlanner,
    Report,
    TurnReporter,
    plan_breaker,
)
from boomerang_vllm_hook.releases import ReleaseInbox
from boomerang_vllm_hook.requestview import (
    KEY,
    Skip,
    TurnContext,
    has_pull_handle,
    retained_handle,
    turn_context,
)
from boomerang_vllm_hook.sender import EngineFacts, Registration, RegistrationSender

MAX_TRACKED = 100_000


@dataclass
class TurnState:
    """What the hook remembers about one request between the connector calls."""

    context: TurnContext | None
    prompt_tokens: int
    plan_id: str = ""
    decision: str = ""
    allocated: bool = False  # holds blocks now (False again after a preemption)
    handle_used: bool = False  # vLLM allocated it with the plan's handle: counts as read
    preemptions: int = 0
    # The hook's own count of prompt tokens not computed, at the last allocation: P's own
    # prefix-cache hits (vLLM's `num_computed_tokens` when it asked) plus the tokens the
    # NixlConnector loads (`num_external_tokens`). Reported as the delivered reuse.
    local_cached: int = 0
    external_cached: int | None = None
    pending: PendingPlan | None = None  # its plan, while in flight and still awaited
    # perf_counter times on P, for the router's cost models: the (last) allocation, and when
    # the NixlConnector finished receiving a pull's blocks.
    allocated_at: float | None = None
    loaded_at: float | None = None


class BoomerangHook:
    """The plain-logic half of `BoomerangConnector`."""

    def __init__(
        self,
        config: HookConfig,
        facts: EngineFacts,
        *,
        registry: SyncRegistryClient | None = None,
        router: SyncRouterClient | None = None,
        router_background: SyncRouterClient | None = None,
    ):
        """Build the workers; the clients default to channels to the configured addresses
        (given ones are for tests)."""
        self.config = config
        self.facts = facts
        b = config.boomerang
        self.counters: Counter[str] = Counter()
        self.plan_seconds: deque[float] = deque(maxlen=4096)
        self._turns: OrderedDict[str, TurnState] = OrderedDict()
        # Answers that came after their request stopped waiting, counted on other threads.
        self.late: Counter[str] = Counter()
        self._late_lock = threading.Lock()
        creds: dict[str, Any] = {"auth_token": b.token(), "tls": b.tls()}
        self.releases = ReleaseInbox()
        self.sender: RegistrationSender | None = None
        heartbeat = b.heartbeat_interval_seconds
        if facts.role == "decode" and b.release_interval_seconds > 0:
            heartbeat = min(heartbeat, b.release_interval_seconds)  # how soon a release reaches D
        if b.registry:
            self.sender = RegistrationSender(
                registry or SyncRegistryClient(b.registry, b.rpc_timeout_seconds, **creds),
                facts,
                queue_size=b.queue_size,
                when_full=b.when_full,
                batch_size=b.batch_size,
                rpc_timeout=b.rpc_timeout_seconds,
                heartbeat_interval=heartbeat,
                load=self.load,
                memory=self.releases.memory,
                on_released=self.releases.receive,
            )
        self.planner: PrefillPlanner | None = None
        self.reporter: TurnReporter | None = None
        # Which prompts may have a live lease: a request the summary rules out goes on at once.
        self.summary: LeaseSummary | None = None
        self.keys_watch: LeaseKeysThread | None = None
        if b.role == "prefill" and b.registry and b.lease_summary:
            self.summary = LeaseSummary()
            self.keys_watch = LeaseKeysThread(
                registry or SyncRegistryClient(b.registry, b.rpc_timeout_seconds, **creds), self.summary,
                f"engine:{facts.engine_id}",
            )
        if b.role == "prefill":
            self.planner = PrefillPlanner(
                # No channel-level retries: inside a plan's wait a retry only eats the deadline.
                router or SyncRouterClient(b.router, b.plan_deadline_ms / 1000, retries=False, **creds),
                engine_id=facts.engine_id,
                model=facts.model,
                deadline=b.plan_deadline_ms / 1000,
                plan_with=b.plan_with,
                chain_block_size=b.chain_block_size or facts.block_size,
                breaker=plan_breaker(b.breaker_failures, b.breaker_cooldown_seconds),
            )
            self.reporter = TurnReporter(
                router_background or SyncRouterClient(b.router, b.rpc_timeout_seconds, **creds),
                queue_size=b.queue_size,
                when_full=b.when_full,
                batch_size=b.batch_size,
                rpc_timeout=b.rpc_timeout_seconds,
                deadline=b.report_deadline_seconds,
            )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the background threads (engine registration happens there)."""
        for worker in (self.sender, self.reporter, self.planner, self.keys_watch):
            if worker is not None:
                worker.start()

    def close(self, timeout: float = 2.0) -> None:
        """Send what can be sent within `timeout`, then stop."""
        for worker in (self.sender, self.reporter):
            if worker is not None:
                worker.close(timeout)
        if self.planner is not None:
            self.planner.close()
        if self.keys_watch is not None:
            self.keys_watch.close()

    def load(self) -> tuple[int, int]:
        """(requests in flight, prompt tokens waiting for allocation), for heartbeats."""
        try:
            turns = list(self._turns.values())  # read from the sender thread
        except RuntimeError:  # changed size mid-copy; the next heartbeat reports it
            return 0, 0
        return len(turns), sum(t.prompt_tokens for t in turns if not t.allocated)

    def stats(self) -> dict[str, Any]:
        """Counters of the hook and its background workers."""
        out: dict[str, Any] = dict(self.counters)
        out.update(self.releases.counters)
        with self._late_lock:
            out.update(self.late)
        if self.planner is not None:
            out["plans_in_flight"] = self.planner.in_flight
        if self.summary is not None:
            out["summary_ready"] = self.summary.ready
            out["summary_keys"] = len(self.summary)
        if self.plan_seconds:
            ordered = sorted(self.plan_seconds)
            out["plan_ms_p50"] = ordered[len(ordered) // 2] * 1000
            out["plan_ms_p99"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
            out["plan_ms_max"] = ordered[-1] * 1000
            out["plan_ms_recent"] = [round(s * 1000, 3) for s in list(self.plan_seconds)[-256:]]
        if self.sender is not None:
            out["sender"] = self.sender.snapshot()
        if self.reporter is not None:
            out["reporter"] = self.reporter.snapshot()
        return out

    # -- the three calls -----------------------------------------------------------------

    def _track(self, request_id: str, state: TurnState) -> TurnState:
        self._turns[request_id] = state
        while len(self._turns) > MAX_TRACKED:
            self._turns.popitem(last=False)
        return state

    def _context(self, request: Any) -> TurnContext | Skip:
        b = self.config.boomerang
        return turn_context(request, b.tenant, b.trust_request_tenant)

    def before_match(self, request: Any, num_computed_tokens: int) -> bool:
        """Whether vLLM may go on with this request now. False means "ask again later": its
        plan is in flight and still worth waiting for. The first call starts the plan."""
        rid = str(request.request_id)
        state = self._turns.get(rid)
        if state is None:
            state = self._admit(request, rid, num_computed_tokens)
        else:
            state.local_cached = max(0, int(num_computed_tokens))
            # vLLM asks again each step until it can schedule the request, and again after
            # a preemption (which freed its blocks: it waits for allocation once more).
            preemptions = int(getattr(request, "num_preemptions", 0) or 0)
            if preemptions > state.preemptions:
                state.preemptions, state.allocated = preemptions, False
        if state.pending is None:
            return True
        attempt = state.pending.take()
        if attempt is None:
            if self.planner is not None and self.planner.clock() < state.pending.wait_until:
                self.counters["plan_waits"] += 1
                return False
            attempt = state.pending.abandon()
            if attempt is None:  # the answer, when it comes, is given back (`_late`)
                state.pending = None
                self.counters["fallback_wait_over"] += 1
                return True
        state.pending = None
        self._apply(request, state, attempt)
        return True

    def _admit(self, request: Any, rid: str, num_computed_tokens: int) -> TurnState:
        """Track a new request and start its plan when a plan could gain something."""
        prompt = list(getattr(request, "prompt_token_ids", None) or [])
        found = self._context(request)
        local = max(0, int(num_computed_tokens))
        state = self._track(rid, TurnState(None if isinstance(found, Skip) else found, len(prompt), local_cached=local))
        if self.planner is None:
            return state
        if isinstance(found, Skip):
            self.counters[found.value] += 1
            return state
        if has_pull_handle(getattr(request, "kv_transfer_params", None)):
            self.counters["handle_given"] += 1  # a gateway planned this turn already
            return state
        # Tokens a pull could spare P: what its own prefix cache does not hold. Below vLLM's
        # recompute threshold the NixlConnector would recompute them anyway.
        gain = len(prompt) - local
        if gain < self.config.kv_recompute_threshold:
            self.counters["no_plan_below_threshold"] += 1
            return state
        b = self.config.boomerang
        wait = worth_waiting(gain, b.prefill_ms_per_token / 1000, b.plan_wait_share, b.plan_deadline_ms / 1000)
        if wait < MIN_WAIT_SECONDS:
            self.counters["no_plan_not_worth_waiting"] += 1
            return state
        if not self.planner.allow():
            self.counters["fallback_breaker_open"] += 1
            return state
        if self._ruled_out(found, prompt):
            # Nothing to pull: vLLM goes on now. The plan still goes, beside the request, to
            # count a wrong "no" (and give back what it claimed).
            beside = self.planner.begin(found, prompt, rid, self.planner.deadline, self._beside, local,
                                         beside=True)
            self.counters["summary_ruled_out" if beside is not None else "fallback_planner_full"] += 1
            return state
        state.pending = self.planner.begin(found, prompt, rid, wait, self._late, local)
        self.counters["plans_started" if state.pending is not None else "fallback_planner_full"] += 1
        return state

    def _ruled_out(self, context: TurnContext, prompt: Any) -> bool:
        """Whether the lease summary says this prompt surely has no live lease to continue."""
        summary = self.summary
        if summary is None or not summary.ready or self.planner is None:
            return False
        if context.conversation_id:
            return not summary.may_have_conversation(context.tenant, context.conversation_id)
        try:
            chain = build_chain(prompt, self.planner.chain_block_size, context.salt)
        except ValueError:
            return False
        return not summary.may_continue(context.tenant, chain)

    def _beside(self, pending: PendingPlan, attempt: PlanAttempt) -> None:
        """The answer to a plan sent beside a request the summary ruled out (any thread): it
        claimed nothing (`turn_started`); a pull it found missed is a wrong "no" (counted).
        Its report settles it in the audit trail."""
        with self._late_lock:
            self.late["summary_checked"] += 1
            if attempt.response is not None and attempt.response.reason == opb.PLAN_REASON_TURN_STARTED:
                self.late["summary_false_no"] += 1
        self._give_back(pending, attempt, "beside")

    def _apply(self, request: Any, state: TurnState, attempt: PlanAttempt) -> None:
        """Act on a plan that came in while vLLM still waited: merge a PULL's params, or
        compute locally."""
        self.plan_seconds.append(attempt.elapsed)
        if attempt.response is None:
            self.counters[f"fallback_{attempt.error.lower()}"] += 1
            if attempt.error == "DEADLINE_EXCEEDED" and attempt.request is not None and self.reporter is not None:
                # The router may have claimed a lease for an answer that never arrived.
                self.reporter.submit(Report(state.context.tenant if state.context else "", replan=attempt.request))
            return
        resp = attempt.response
        state.plan_id, state.decision = resp.plan_id, decision_name(resp)
        self.counters[f"plan_{state.decision.lower()}"] += 1
        params = pull_params(resp)
        if state.decision == "PULL" and params is None:
            # Unusable params: vLLM never sees the handle, so the claim goes back unread.
            self.counters["bad_plan_params"] += 1
            state.decision = "PULL_UNUSED"
        if params is not None:
            current = getattr(request, "kv_transfer_params", None)
            merged = dict(current) if isinstance(current, dict) else {}
            merged.update(params)
            request.kv_transfer_params = merged
            self.counters["reused_tokens"] += reused_tokens(resp)

    def _late(self, pending: PendingPlan, attempt: PlanAttempt) -> None:
        """An answer nobody waits for any more (any thread): give back what it claimed. vLLM
        never saw its handle, so the lease goes back to the conversation unread."""
        with self._late_lock:
            self.late["late_answers"] += 1
        self._give_back(pending, attempt, "late")

    def _give_back(self, pending: PendingPlan, attempt: PlanAttempt, kind: str) -> None:
        report: Report | None = None
        if attempt.response is not None:
            report = Report.give_back(pending.context.tenant, attempt.response)
        elif attempt.error == "DEADLINE_EXCEEDED" and attempt.request is not None:
            report = Report(pending.context.tenant, replan=attempt.request)
        with self._late_lock:
            if report is not None and self.reporter is not None:
                queued = self.reporter.submit(report)
                self.late[f"{kind}_given_back" if queued else f"{kind}_report_rejected_full"] += 1

    def after_alloc(self, request: Any, num_external_tokens: int) -> None:
        """vLLM allocated the request: with a PULL plan, the handle is now in use."""
        state = self._turns.get(str(request.request_id))
        if state is not None:
            state.allocated = state.handle_used = True
            state.external_cached = max(0, int(num_external_tokens))
            state.allocated_at, state.loaded_at = time.perf_counter(), None

    def loaded(self, request_ids: Any) -> None:
        """The NixlConnector finished receiving these requests' pulled blocks (prefill engines)."""
        now = time.perf_counter()
        for rid in request_ids:
            state = self._turns.get(str(rid))
            if state is not None and state.allocated_at is not None and state.loaded_at is None:
                state.loaded_at = now

    def on_finished(self, request: Any, result: tuple[bool, dict[str, Any] | None]) -> tuple[bool, dict[str, Any] | None]:
        """Register D's retained blocks, or report P's plan; returns vLLM's result (P's params
        gain the conversation, so it reaches D)."""
        state = self._turns.pop(str(request.request_id), None)
        if state is not None and state.pending is not None:
            # It ended (aborted, say) with its plan in flight: whatever that plan claimed goes back.
            attempt = state.pending.abandon()
            if attempt is not None:
                self._late(state.pending, attempt)
            state.pending = None
        delay_free, params = result
        role = self.config.boomerang.role
        if role == "decode":
            self._register(request, params)
            return result
        if state is not None and state.plan_id and self.reporter is not None:
            use = opb.HANDLE_USE_UNSPECIFIED
            if state.decision == "PULL":
                use = opb.HANDLE_USE_READ if state.handle_used else opb.HANDLE_USE_UNKNOWN
            elif state.decision == "PULL_UNUSED":
                use = opb.HANDLE_USE_NOT_READ
            delivered = None if state.external_cached is None else state.local_cached + state.external_cached
            prefill, copy = _measured(state, delay_free)
            report = Report(state.context.tenant if state.context else "", state.plan_id, use,
                            delivered_cached_tokens=delivered, prefill_seconds=prefill, copy_seconds=copy)
            if not self.reporter.submit(report):
                self.counters["report_rejected_full"] += 1
        if state is not None and state.context is not None and isinstance(params, dict) and params.get("do_remote_prefill"):
            if self.summary is not None and state.context.conversation_id:
                # D is about to register this turn: its conversation's next turn may pull, here,
                # before the registry's stream says so.
                self.summary.add([conversation_key(state.context.tenant, state.context.conversation_id)])
            return delay_free, {**params, KEY: state.context.as_params()}
        return result

    def _register(self, request: Any, params: dict[str, Any] | None) -> None:
        if self.sender is None:
            return
        handle = retained_handle(params)
        if handle is None:
            self.counters["finished_without_handle"] += 1  # aborted, or not a bidirectional turn
            return
        if handle.engine_id != self.facts.engine_id:
            self.counters["foreign_engine"] += 1  # not this engine's blocks: not ours to register
            return
        found = self._context(request)
        if isinstance(found, Skip):
            self.counters[found.value] += 1
            return
        everything = getattr(request, "all_token_ids", None) or []
        wanted = handle.num_tokens if handle.num_tokens is not None else len(everything)
        tokens = tuple(itertools.islice(everything, wanted))
        if wanted <= 0 or len(tokens) != wanted:
            self.counters["inconsistent_num_tokens"] += 1  # D claims KV for tokens it does not have
            return
        ttl = self.config.decoder_kv_blocks_ttl
        now_perf, now_wall = time.perf_counter(), time.time()
        expiry = handle.expiry_time if handle.expiry_time is not None else now_perf + ttl
        # D set its expiry to finish + ttl on this very clock, so the finish time is exact.
        finish = min(now_wall, now_wall - (now_perf - (expiry - ttl)))
        ok = self.sender.submit(Registration(found, handle, tokens, finish), expiry)
        if ok:
            # vLLM keys its send deadlines by request id, which D exports as remote_request_id.
            self.releases.pin(handle.remote_request_id, expiry, sum(len(g) for g in handle.block_groups))
        self.counters["registrations_queued" if ok else "registrations_rejected_full"] += 1


def _measured(state: TurnState, delay_free: bool) -> tuple[float | None, float | None]:
    """P's prefill of a turn that finished normally (allocation to now: P's one output token),
    and of that the pull's copy; None for a turn that did not (aborted: its time says nothing)."""
    if state.allocated_at is None or not delay_free:
        return None, None
    now = time.perf_counter()
    copy = state.loaded_at - state.allocated_at if state.loaded_at is not None and state.external_cached else None
    return now - state.allocated_at, copy
