"""The gateway's side of the control plane: PlanTurn before a turn, ReportTurn after it.

Neither may cost a user a request. A plan that fails or misses its deadline becomes a plain
prefill→decode turn (recompute), and for `control_plane_backoff_seconds` after such a
failure the gateway does not ask at all, so a dead router costs each turn nothing.

A turn's report registers the lease its next turn pulls, so the client gets its last byte
only once ReportTurn is answered (the router answers after the registry committed):
`wait_for_report` waits for it, at most `commit_timeout` seconds. Past that, or when the report
fails, the turn still ends (its next turn may recompute) and the miss is counted; the report
goes on in the background, and shutdown waits for those (up to a deadline) so a drain loses
none.

A client may send its next turn before the previous turn's report has landed (a benchmark
does, at once). The next plan of the same conversation therefore waits for that report —
at most the plan deadline — or it would find no lease and recompute a prefix it could pull.

A turn's reuse outcome compares what the plan promised with what the prefill engine
delivered, and says why a turn reused less. The prefill engine is the witness of what it
did not compute. vLLM 0.33.0 tells it two ways: `usage.prompt_tokens_details.cached_tokens`
when it runs with `--enable-prompt-tokens-details`, and always `remote_prefill_cached_tokens`
in the `kv_transfer_params` a prefill returns (its scheduler puts P's count there so the
decode engine can report it). Either counts every prompt token P did not compute: those
pulled from the decode engine plus any its own prefix cache served.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boomerang import plans
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.router import RouterClient
from boomerang.resilience import TRANSIENT_CODES, CircuitBreaker
from boomerang.tokenchain import salt_key
from boomerang.v1 import router_service_pb2 as rtpb

log = logging.getLogger(__name__)

# The first-turn form of kv_transfer_params (docs/vllm-contract.md, "The first turn"): P
# computes everything.
FIRST_TURN: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

SLOW_PLANS_TO_BACK_OFF = 3
# UNAVAILABLE answers about one model, not the router: they back nothing off.
ONE_MODELS_REASONS = frozenset({"NO_PREFILL_ENGINE", "NO_DECODE_ENGINE"})

HANDLE_USE = {"READ": rtpb.HANDLE_USE_READ, "NOT_READ": rtpb.HANDLE_USE_NOT_READ, "UNKNOWN": rtpb.HANDLE_USE_UNKNOWN}


def first_turn_params() -> dict[str, Any]:
    """A fresh copy of the first-turn `kv_transfer_params`."""
    return dict(FIRST_TURN)


@dataclass
class Plan:
    """What the gateway does this turn."""

    decision: str
    reason: str
    kv_transfer_params: dict[str, Any] = field(default_factory=first_turn_params)
    plan_id: str = ""
    prefill_url: str = ""
    decode_url: str = ""
    reused_tokens: int = 0
    # The lease summary ruled the turn out: it started COLD without a plan. Its router plan is
    # made at its first token, from the prompt ids on D's first chunk, for the report's plan id
    # (and to tell whether the "no" was wrong), so nothing competes with the turn's prefill.
    planned_after: bool = False


def fallback(conversation_id: str, reason: str) -> Plan:
    """A plain prefill→decode turn: RECOMPUTE when there may have been something to reuse."""
    return Plan("RECOMPUTE" if conversation_id else "COLD", reason)


def engine_plan(conversation_id: str, tenant: str) -> Plan:
    """A turn the engines' vLLM hook plans: the prefill engine gets the first-turn params and
    the conversation with its tenant (`kv_transfer_params.boomerang`, which P copies into the
    params it returns for D); no plan id, so nothing is reported from here."""
    params = first_turn_params()
    if not conversation_id:
        return Plan("COLD", "ENGINE_HOOK", params)
    params["boomerang"] = {"conversation_id": conversation_id, "tenant": tenant}
    return Plan("ENGINE", "ENGINE_HOOK", params)


# The turn reused less than the plan said: the prefill engine reported fewer cached tokens
# than it was told to pull (it declined the pull — an expiring handle, a failed read — or
# pulled part of it).
PREFILL_SHORTFALL = "PREFILL_SHORTFALL"


@dataclass(frozen=True)
class ReuseOutcome:
    """One served turn's reuse, in prompt tokens."""

    prompt_tokens: int  # 0 when the gateway never tokenized the prompt
    planned: int  # the plan's reusable tokens (PULL only)
    delivered: int | None  # the prefill engine's own count; None when it reported none
    declined: str  # why the turn reused less than planned, or nothing; "" when it did not

    @property
    def cached_tokens(self) -> int:
        """`usage.prompt_tokens_details.cached_tokens`: the prompt tokens not recomputed."""
        return self.delivered if self.delivered is not None else self.planned


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def delivered_by_prefill(body: Any) -> int | None:
    """The prompt tokens a prefill response says were not computed, or None if it does not say."""
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and (n := _count(details.get("cached_tokens"))) is not None:
        return n
    params = body.get("kv_transfer_params")
    if isinstance(params, dict):
        return _count(params.get("remote_prefill_cached_tokens"))
    return None


def prompt_tokens_of(body: Any) -> int:
    """The prompt length a response's `usage` gives, or 0."""
    usage = body.get("usage") if isinstance(body, dict) else None
    return (_count(usage.get("prompt_tokens")) or 0) if isinstance(usage, dict) else 0


def reuse_outcome(
    decision: str, reason: str, prompt_tokens: int, planned: int, delivered: int | None
) -> ReuseOutcome:
    """The outcome of a turn whose prefill succeeded.

    `decision` and `reason` are the plan's after the gateway's own changes (a PULL retried as
    a recompute is `RECOMPUTE`/`PREFILL_RETRY`); `planned` is the router's reusable tokens
    before them. A turn that reused nothing is declined for the plan's reason (`NO_LEASE`,
    `PREFIX_MISMATCH`, … or the gateway's `TOKENIZE_FAILED`, `CONTROL_PLANE_DEGRADED`,
    `REUSE_OFF`, `PREFILL_RETRY`); a PULL whose prefill engine reports fewer cached tokens
    than planned is a `PREFILL_SHORTFALL`. A turn the engines' vLLM hook planned (`ENGINE`:
    the gateway knows no plan) is declined only when the prefill engine reports it reused
    nothing.
    """
    if decision == "ENGINE":
        declined = (reason or "UNSPECIFIED") if delivered == 0 else ""
    elif decision not in ("PULL", "PREFILL_ON_DECODE"):  # the latter reuses D's own cache
        declined = reason or "UNSPECIFIED"
    elif delivered is not None and delivered < planned:
        declined = PREFILL_SHORTFALL
    else:
        declined = ""
    return ReuseOutcome(prompt_tokens, planned, delivered, declined)


@dataclass
class Report:
    """What happened in a planned turn, for ReportTurn; with the defaults, a turn that ended
    without a lease to register (its report only settles the plan's claim)."""

    tenant: str
    plan_id: str
    conversation_id: str
    handle_use: str
    decode_kv_transfer_params: dict[str, Any] | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    finish_time_unix: float = field(default_factory=time.time)
    # Prompt tokens the prefill engine reports it did not compute; None when it reported none.
    delivered_tokens: int | None = None
    cache_salt: str = ""  # the request's, as given to PlanTurn: it seeds the registered chain
    # Measured, for the router's cost models: the prefill (P's request, or D's time to first
    # token when D prefilled) and D's mean gap between output tokens; None when not measured.
    prefill_seconds: float | None = None
    inter_token_seconds: float | None = None
    decode_first_token_seconds: float | None = None
    background_plan: asyncio.Task[Plan | None] | None = None  # the plan id comes from it (Plan.planned_after)


class ControlPlane:
    """PlanTurn with a deadline and a back-off; ReportTurn in the background."""

    def __init__(
        self,
        router: RouterClient | None,
        plan_timeout: float,
        report_timeout: float,
        backoff: float,
        on_report: Callable[[str], None] | None = None,
        reconnect: Callable[[], RouterClient] | None = None,
        commit_timeout: float = 0.0,
        prefill_on_decode: bool = False,
    ):
        self.router = router
        self.prefill_on_decode = prefill_on_decode  # may the router plan PREFILL_ON_DECODE
        self.commit_timeout = commit_timeout
        self.on_report = on_report
        # Makes a fresh client after a failure: a gRPC channel that failed to connect waits
        # out its own reconnect back-off (up to two minutes) even once the router is back.
        self.reconnect = reconnect
        self._stale = False
        self._retired: set[RouterClient] = set()
        self._closers: set[asyncio.Task[None]] = set()
        self.plan_timeout = plan_timeout
        self.report_timeout = report_timeout
        self.backoff = backoff
        # A router that cannot be reached pauses every turn's router call for `backoff` seconds
        # at once; one that is slow or failing, after SLOW_PLANS_TO_BACK_OFF late or failed
        # (transient) answers in a row (under load a single late plan is no reason to take
        # reuse from every turn for a second); then all ask again. An error about one request
        # (a bad field, a refused tenant, a model without engines) is that turn's alone.
        self.breaker = CircuitBreaker(SLOW_PLANS_TO_BACK_OFF, backoff, one_trial=False)
        self._reports: set[asyncio.Task[str]] = set()
        # (tenant, conversation) → its report in flight, awaited by the next plan.
        self._pending: dict[tuple[str, str], asyncio.Task[str]] = {}

    def available(self) -> bool:
        """Whether to ask the router now (configured, and not backing off after a failure)."""
        return self.router is not None and self.breaker.allow()

    def _failed(self, code: str, reason: str = "") -> None:
        if reason in ONE_MODELS_REASONS:
            return  # the router is fine; this model has no engine there
        if code == "UNAVAILABLE":
            self.breaker.trip()
            self._stale = self.reconnect is not None
        elif code in TRANSIENT_CODES:
            self.breaker.record_failure()
            self._stale = self._stale or (self.reconnect is not None and self.breaker.is_open)

    def _fresh_channel(self) -> None:
        """Swap in a new client after a failure; the old one closes once reports still using
        it have had their deadline."""
        if self._stale and self.reconnect is not None and self.router is not None:
            old = self.router
            self._retired.add(old)
            self.router = self.reconnect()
            self._stale = False

            async def close_later() -> None:
                await asyncio.sleep(self.report_timeout + 1.0)
                if old in self._retired:
                    self._retired.discard(old)
                    await old.close()

            task = asyncio.ensure_future(close_later())
            self._closers.add(task)
            task.add_done_callback(self._closers.discard)

    async def ask_router_for_plan(
        self,
        tenant: str,
        conversation_id: str,
        model: str,
        token_ids: list[int],
        timings: dict[str, float] | None = None,
        cache_salt: str = "",
        turn_started: bool = False,
    ) -> Plan | None:
        """The router's plan, or None when it failed or was late (the turn recomputes).

        `cache_salt` is the request's (vLLM's isolation key): leases of another salt never match.

        The plan waits for the conversation's previous report when one is in flight (its lease
        is what this turn pulls); `timings` gets `report_wait`, the seconds waited. A plan of a
        turn that already started (`turn_started`, made beside its decode) does not: the report
        in flight may be its own, which waits for that very plan. Such a plan claims nothing;
        its reason is TURN_STARTED when it missed a pull.
        """
        if self.router is None or not self.available():
            return None
        self._fresh_channel()
        assert self.router is not None
        pending = self._pending.get((tenant, conversation_id)) if conversation_id else None
        if not turn_started and pending is not None and not pending.done():
            started = time.monotonic()
            await asyncio.wait({pending}, timeout=self.plan_timeout)
            if timings is not None:
                timings["report_wait"] = time.monotonic() - started
        req = plans.plan_request(tenant, conversation_id, model, token_ids,
                                 request_id=str(uuid.uuid4()), salt=salt_key(cache_salt),
                                 turn_started=turn_started)
        req.can_prefill_on_decode = self.prefill_on_decode  # such a turn goes straight to D
        try:
            resp = await asyncio.wait_for(self.router.plan_turn(req, timeout=self.plan_timeout), self.plan_timeout * 1.5)
        except (TimeoutError, BoomerangClientError) as exc:
            log.warning("PlanTurn failed, recomputing: %s", exc)
            if isinstance(exc, BoomerangClientError):
                self._failed(exc.code, exc.reason)
            else:
                self._failed("DEADLINE_EXCEEDED")
            return None
        except Exception:
            log.warning("PlanTurn failed, recomputing", exc_info=True)
            self._failed("UNKNOWN")
            return None
        self.breaker.record_success()
        if not plans.usable(resp):
            log.warning("PlanTurn answered an unusable plan (%s); recomputing", plans.decision_name(resp))
            return None
        decision, params = plans.decision_name(resp), plans.pull_params(resp)
        return Plan(
            decision=decision,
            reason=plans.reason_name(resp),
            kv_transfer_params=params if params is not None else first_turn_params(),
            plan_id=resp.plan_id,
            prefill_url=resp.prefill_engine.http_base_url.rstrip("/"),
            decode_url=resp.decode_engine.http_base_url.rstrip("/"),
            reused_tokens=plans.reused_tokens(resp),
        )

    def send_report_later(self, report: Report) -> asyncio.Task[str] | None:
        """Send ReportTurn in the background; the task answers its outcome."""
        if self.router is None or not (report.plan_id or report.background_plan is not None):
            return None
        task = asyncio.ensure_future(self._send_report(report))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)
        if report.conversation_id:
            key = (report.tenant, report.conversation_id)
            self._pending[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        return task

    def _forget(self, key: tuple[str, str], task: asyncio.Task[str]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]

    async def wait_for_report(self, task: asyncio.Task[str] | None) -> tuple[str, float]:
        """Wait (at most `commit_timeout`) for a report sent by `send_report_later`.

        Answers `committed` (ReportTurn answered: the registry has the lease), `failed`,
        `timed_out` (it goes on in the background), or `none` (nothing to wait for), and
        the seconds waited.
        """
        if task is None or self.commit_timeout <= 0:
            return "none", 0.0
        started = time.monotonic()
        done, _ = await asyncio.wait({task}, timeout=self.commit_timeout)
        waited = time.monotonic() - started
        if not done:
            return "timed_out", waited
        return ("failed" if task.cancelled() or task.result() == "FAILED" else "committed"), waited

    async def _send_report(self, report: Report) -> str:
        if report.background_plan is not None:
            plan = await report.background_plan  # bounded by its tokenize and plan deadlines
            if plan is None:
                return "FAILED"  # no plan id: nothing to report, and the turn registers no lease
            report.plan_id = plan.plan_id
            if plan.decision == "PULL":
                report.handle_use = "NOT_READ"  # the turn had started without its handle
        assert self.router is not None
        req = plans.report_request(
            report.tenant,
            report.plan_id,
            HANDLE_USE[report.handle_use],
            delivered_cached_tokens=report.delivered_tokens,
            prefill_seconds=report.prefill_seconds,
            inter_token_seconds=report.inter_token_seconds,
            decode_first_token_seconds=report.decode_first_token_seconds,
        )
        req.conversation_id = report.conversation_id
        req.finish_time_unix = report.finish_time_unix
        req.request_id = str(uuid.uuid4())
        req.cache_salt = salt_key(report.cache_salt)
        if report.decode_kv_transfer_params:
            req.decode_kv_transfer_params_json = json.dumps(report.decode_kv_transfer_params, separators=(",", ":"))
            req.prompt_token_ids.extend(report.prompt_token_ids)
            req.output_token_ids.extend(report.output_token_ids)
        try:
            resp = await self.router.report_turn(req, timeout=self.report_timeout)
            outcome: str = rtpb.RetentionOutcome.Name(resp.retention).removeprefix("RETENTION_OUTCOME_")
            if resp.retention == rtpb.RETENTION_OUTCOME_REJECTED:
                log.warning("ReportTurn %s: retention rejected: %s", report.plan_id, resp.retention_detail)
        except Exception as exc:  # noqa: BLE001 - a lost report costs the next turn's reuse, nothing more
            log.warning("ReportTurn %s failed: %s", report.plan_id, exc)
            outcome = "FAILED"
        if self.on_report is not None:
            self.on_report(outcome)
        return outcome

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for reports in flight, then close the clients."""
        if self._reports:
            await asyncio.wait(set(self._reports), timeout=timeout)
        for task in list(self._closers):
            task.cancel()
        for client in [*self._retired, *([self.router] if self.router is not None else [])]:
            await client.close()
        self._retired.clear()
