"""One turn is one trace: every service exports over OTLP/gRPC to a receiver the test runs,
and the spans of a turn share the trace id the client sent, across gateway, router,
registry (with its Postgres statements), and both simulated engines.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.ministack import MiniStack, converse
from tests.support.otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.e2e

SERVICES = {"boomerang-gateway", "boomerang-router", "boomerang-registry", "boomerang-sim-prefill", "boomerang-sim-decode"}
SERVER, CLIENT = 2, 3  # OTLP span kinds


@dataclass
class Traced:
    """The stack, the receiver, and a two-turn conversation sent with our own trace ids."""

    stack: MiniStack
    receiver: OtlpReceiver
    conversation: str
    ids: list[tuple[str, str]]  # (trace id, client span id) per turn
    replies: list[httpx.Response]


def _traceparent(trace_id: str, span_id: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{span_id}-01"}


@pytest.fixture(scope="module")
def traced(database_url: str) -> Iterator[Traced]:
    receiver = OtlpReceiver().start()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: spans arrive soon after they end
    }
    for name in ("OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        env[name] = ""  # the test decides, not the caller's shell
    stack = MiniStack(database_url, env, reaper=True).start()
    try:
        conversation = f"trace-{stack.run}"
        ids = [(os.urandom(16).hex(), os.urandom(8).hex()) for _ in range(2)]
        replies = converse(stack, conversation, 2, lambda i: _traceparent(*ids[i]))
        yield Traced(stack, receiver, conversation, ids, replies)
    finally:
        stack.stop()
        receiver.stop()


def _of(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


def test_one_turn_is_one_trace_across_every_service(traced: Traced) -> None:
    receiver, ids, replies, conversation = traced.receiver, traced.ids, traced.replies, traced.conversation
    assert replies[1].headers["X-Boomerang-Plan"] == "PULL", replies[1].headers
    trace_id, client_span = ids[1]

    def complete(spans: list[ReceivedSpan]) -> bool:
        """Every service is in, the report has reached the registry, and no parent is missing."""
        mine = _of(spans, trace_id)
        known = {s.span_id for s in mine} | {client_span}
        return (
            SERVICES <= {s.service for s in mine}
            and any(s.name.endswith("/CompleteTurn") and s.kind == SERVER for s in mine)
            and all(s.parent_span_id in known for s in mine)
        )

    spans = _of(receiver.wait_for(complete, timeout=20), trace_id)
    by_service: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        by_service.setdefault(s.service, []).append(s)
    assert SERVICES <= set(by_service), f"services in the trace: {sorted(by_service)}"

    # One tree: the gateway's server span is the only child of the client's span, and every
    # other span's parent is in the trace.
    ids_in_trace = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id == client_span]
    assert [(r.service, r.name, r.kind) for r in roots] == [("boomerang-gateway", "POST /v1/chat/completions", SERVER)]
    orphans = [s for s in spans if s.parent_span_id not in ids_in_trace and s is not roots[0]]
    assert orphans == [], orphans

    names = {(s.service, s.name) for s in spans}
    # gateway → tokenize → router → registry → Postgres → prefill → decode → report
    assert ("boomerang-gateway", "POST /tokenize") in names
    assert ("boomerang-sim-prefill", "POST /tokenize") in names
    assert ("boomerang-router", "/boomerang.v1.RouterService/PlanTurn") in names
    assert ("boomerang-registry", "/boomerang.v1.BlockRegistryService/ClaimReuse") in names
    assert ("boomerang-gateway", "/boomerang.v1.RouterService/PlanTurn") in names
    assert any(s.service == "boomerang-registry" and s.attributes.get("db.system") == "postgresql" for s in spans), (
        "no Postgres span from the registry"
    )
    assert ("boomerang-sim-prefill", "POST /v1/chat/completions") in names
    assert ("boomerang-sim-decode", "POST /v1/chat/completions") in names
    assert ("boomerang-sim-decode", "POST /sim/nixl/read") in names  # P pulled D's blocks
    assert ("boomerang-router", "/boomerang.v1.RouterService/ReportTurn") in names
    # The turn ends in one registry call: the claim consumed and the new lease registered.
    assert ("boomerang-registry", "/boomerang.v1.BlockRegistryService/CompleteTurn") in names

    plan = next(s for s in spans if s.name == "/boomerang.v1.RouterService/PlanTurn" and s.kind == SERVER)
    assert plan.attributes["boomerang.decision"] == "PULL"
    assert plan.attributes["boomerang.reason"] == "VERIFIED_PREFIX"
    assert plan.attributes["boomerang.conversation"] == conversation
    assert plan.attributes["boomerang.tenant"] == "anonymous"
    assert plan.attributes["boomerang.reused_tokens"] == int(replies[1].headers["X-Boomerang-Reused-Tokens"]) > 0
    assert plan.attributes["boomerang.recomputed_tokens"] > 0
    turn = roots[0]
    assert turn.attributes.get("boomerang.decision") == "PULL", turn.attributes
    assert turn.attributes.get("boomerang.conversation") == conversation

    # The first turn (COLD) is its own trace, with no span of the second.
    first = _of(receiver.snapshot(), ids[0][0])
    assert first and not ({s.span_id for s in first} & ids_in_trace)


def test_background_work_and_health_checks_start_no_trace(traced: Traced) -> None:
    """Heartbeats, pool refreshes, gauge reads, the reaper's loop and its deadline watch run all
    the time; none opens a trace. Every span belongs to a request: a turn the test sent, or
    a call the test made itself (the gateway's model list, the registry's GetConversation)."""
    turns = {t for t, _ in traced.ids}

    def stray(got: list[ReceivedSpan]) -> list[tuple[str, str]]:
        requests = {s.trace_id for s in got if not s.parent_span_id} | turns
        return sorted({(s.service, s.name) for s in got if s.trace_id not in requests})

    # A request's children can be exported a batch before its root: wait for it to settle.
    spans = traced.receiver.wait_for(lambda got: turns <= {s.trace_id for s in got} and not stray(got), timeout=5)
    roots = [s for s in spans if not s.parent_span_id]
    assert all(r.kind == SERVER for r in roots), sorted({(r.service, r.name, r.kind) for r in roots})
    assert {(r.service, r.name) for r in roots} <= {
        ("boomerang-gateway", "GET /v1/models"),
        ("boomerang-registry", "/boomerang.v1.BlockRegistryService/GetConversation"),
    }, sorted({(r.service, r.name) for r in roots})
    assert stray(spans) == [], "spans of traces no request started"


def test_the_deadline_watch_works_with_tracing_on(traced: Traced) -> None:
    """The OpenTelemetry server interceptor iterates a streaming handler's result: the reaper's
    deadline watch must be an async generator, or it fails with tracing on (the watch then
    falls back to polling)."""
    logs = {name: "\n".join(proc.lines) for name, proc in traced.stack.procs.items()}
    assert "deadline watch opened" in logs["registry"]
    assert "deadline watch ended" not in logs["reaper"]
    assert "Unexpected [TypeError]" not in logs["registry"] + logs["router"]
    assert "PlanTurn failed" not in logs["gateway"]
