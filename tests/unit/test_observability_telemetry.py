"""Telemetry: off (and free) unless configured; when on, request-rooted sampling, W3C context
over HTTP both ways, and `boomerang.` attributes — checked with the in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from enum import Enum
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
from boomerang import telemetry
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER",
             "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER")


def test_off_unless_configured_and_then_nothing_of_opentelemetry_is_even_imported() -> None:
    script = """
import json, sys
from boomerang import telemetry
import boomerang_gateway.server, boomerang_registry.server, boomerang_router.server, boomerang_reaper.server
import boomerang_tools.sim.cli
app = object()
result = {
    "setup": telemetry.setup_tracing("x"),
    "server": telemetry.grpc_server_interceptors(),
    "client": telemetry.grpc_client_interceptors(),
    "same_app": telemetry.asgi_app(app) is app,
}
telemetry.instrument_engine(None)
telemetry.annotate(decision="PULL")
with telemetry.span("x", tenant="t") as s:
    result["span"] = s
result["otel_modules"] = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(json.dumps(result))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"setup": False, "server": [], "client": [], "same_app": True, "span": None, "otel_modules": []}


@pytest.mark.parametrize(
    "env,wanted",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_requested_by_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], wanted: bool
) -> None:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert telemetry.tracing_requested() is wanted


def test_traces_start_at_requests_not_at_background_calls() -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    sampler = telemetry.request_sampler()

    def decide(name: str, kind: SpanKind, parent: object = None) -> Decision:
        return sampler.should_sample(parent, 0x1234, name, kind).decision  # type: ignore[arg-type]

    assert decide("POST /v1/chat/completions", SpanKind.SERVER) is Decision.RECORD_AND_SAMPLE
    assert decide("/boomerang.v1.RouterService/PlanTurn", SpanKind.SERVER) is Decision.RECORD_AND_SAMPLE
    assert decide("boomerang_tools.replay", SpanKind.INTERNAL) is Decision.RECORD_AND_SAMPLE
    # A heartbeat, a pool refresh, a gauge read: client spans nobody asked for.
    assert decide("/boomerang.v1.BlockRegistryService/Heartbeat", SpanKind.CLIENT) is Decision.DROP
    assert decide("SELECT", SpanKind.CLIENT) is Decision.DROP
    assert decide("/grpc.health.v1.Health/Check", SpanKind.SERVER) is Decision.DROP
    assert decide("/boomerang.v1.BlockRegistryService/WatchLeaseDeadlines", SpanKind.SERVER) is Decision.DROP
    assert decide("/boomerang.v1.BlockRegistryService/WatchLeaseKeys", SpanKind.SERVER) is Decision.DROP
    sampled = set_span_in_context(NonRecordingSpan(SpanContext(0x1234, 0x99, True, TraceFlags(1))))
    unsampled = set_span_in_context(NonRecordingSpan(SpanContext(0x1234, 0x99, True, TraceFlags(0))))
    # Inside a request every call is traced; inside a dropped trace none is.
    assert decide("SELECT", SpanKind.CLIENT, sampled) is Decision.RECORD_AND_SAMPLE
    assert decide("/boomerang.v1.RouterService/PlanTurn", SpanKind.SERVER, unsampled) is Decision.DROP


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, in this process, into memory (undone afterwards for the other tests)."""
    exporter = InMemorySpanExporter()
    assert telemetry.setup_tracing("boomerang-unit", exporter=exporter)
    try:
        yield exporter
    finally:
        from opentelemetry.instrumentation import httpx as httpx_instrumentation

        for name in ("HTTPXClientInstrumentor", "HTTPX2ClientInstrumentor"):
            instrumentor = getattr(httpx_instrumentation, name, None)
            if instrumentor is not None and instrumentor().is_instrumented_by_opentelemetry:
                instrumentor().uninstrument()
        telemetry._enabled = False


class Color(str, Enum):
    RED = "RED"


def test_annotate_and_span_record_boomerang_attributes(spans: InMemorySpanExporter) -> None:
    spans.clear()
    with telemetry.span("boomerang.turn", tenant="acme", skipped=None):
        telemetry.annotate(decision=Color.RED, reused_tokens=42, lease_id=None)
    (span,) = spans.get_finished_spans()
    assert span.name == "boomerang.turn"
    assert dict(span.attributes or {}) == {"boomerang.tenant": "acme", "boomerang.decision": "RED",
                                           "boomerang.reused_tokens": 42}


def test_http_server_spans_continue_the_callers_trace(spans: InMemorySpanExporter) -> None:
    async def tokenize(request: Request) -> JSONResponse:
        telemetry.annotate(conversation="c1")
        return JSONResponse({"tokens": [1, 2, 3]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = telemetry.asgi_app(Starlette(routes=[Route("/tokenize", tokenize, methods=["POST"]),
                                               Route("/health", health)]))
    trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
    spans.clear()

    async def call() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            assert (await client.post("/tokenize", headers={"traceparent": f"00-{trace_id}-{parent}-01"})).status_code == 200
            assert (await client.get("/health")).status_code == 200

    import asyncio

    asyncio.run(call())
    finished = spans.get_finished_spans()
    assert [(s.name, s.kind) for s in finished] == [("POST /tokenize", SpanKind.SERVER)]  # /health is not traced
    server = finished[0]
    assert f"{server.context.trace_id:032x}" == trace_id and f"{server.parent.span_id:016x}" == parent
    assert server.attributes["boomerang.conversation"] == "c1"


def test_httpx_calls_are_client_spans_that_carry_traceparent(spans: InMemorySpanExporter) -> None:
    seen: list[str] = []

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("traceparent", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    spans.clear()
    try:
        with (
            trace.get_tracer("test").start_as_current_span("turn", kind=SpanKind.SERVER) as turn,
            httpx.Client() as client,
        ):
            client.get(f"http://127.0.0.1:{server.server_port}/v1/models")
    finally:
        server.shutdown()
        server.server_close()
    client_span = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT)
    assert client_span.name == "GET /v1/models"
    assert client_span.parent.span_id == turn.get_span_context().span_id
    _version, trace_id, span_id, flags = seen[0].split("-")
    assert (trace_id, span_id) == (f"{client_span.context.trace_id:032x}", f"{client_span.context.span_id:016x}")
    assert int(flags, 16) & 1, "sampled"
