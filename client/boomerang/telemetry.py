"""OpenTelemetry set-up shared by every service.

Tracing is off unless the standard variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
`OTEL_TRACES_EXPORTER=otlp|console`); then spans go out over OTLP/gRPC, gRPC servers and
clients carry W3C trace context, httpx calls become client spans (with `traceparent`
injected), HTTP servers wrapped by `asgi_app` continue the caller's trace, and SQLAlchemy
statements become spans. One turn is then one trace: gateway → tokenize → router →
registry → Postgres → prefill → decode → report.

Custom attributes are prefixed `boomerang.` (`annotate`). When tracing is off every helper
here is a flag check: nothing from the OpenTelemetry SDK or its instrumentations is imported.

Sampling: unless `OTEL_TRACES_SAMPLER` says otherwise, traces start only where a request
starts (an HTTP or gRPC server span). Background loops — heartbeats, pool refreshes, gauge
reads, the reaper's expiry calls, the audit writer — would otherwise open a new trace every
second or so and bury the turns; their root spans are dropped, and with them the whole
trace (the receiving side follows the caller's sampled flag). Health checks and reflection
are dropped the same way. `OTEL_TRACES_SAMPLER=parentbased_always_on` traces everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

_enabled = False

# Root spans with these name prefixes are never sampled (see the module docstring); the
# reaper's deadline watch and the lease-keys watch are streams that last as long as the process.
_UNTRACED_ROOTS = (
    "/grpc.health.",
    "/grpc.reflection.",
    "/boomerang.v1.BlockRegistryService/WatchLeaseDeadlines",
    "/boomerang.v1.BlockRegistryService/WatchLeaseKeys",
)
# HTTP paths whose requests are not traced (health probes and Prometheus scrapes).
UNTRACED_PATHS = ("/health", "/metrics", "/sim/stats")


def tracing_requested() -> bool:
    """Whether the environment asks for traces."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if exporter == "none" or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(exporter or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def enabled() -> bool:
    """Whether this process traces (set up by `setup_tracing`)."""
    return _enabled


def request_sampler() -> Any:
    """The default sampler: follow the caller; start traces only for requests."""
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.sdk.trace.sampling import (
        ALWAYS_OFF,
        ALWAYS_ON,
        ParentBased,
        Sampler,
        SamplingResult,
    )
    from opentelemetry.trace import SpanKind

    class RequestRoots(Sampler):
        """Samples root spans that a request opens; drops background and health roots."""

        def should_sample(  # type: ignore[no-untyped-def]
            self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
        ) -> SamplingResult:
            drop = kind is SpanKind.CLIENT or name.startswith(_UNTRACED_ROOTS)
            return (ALWAYS_OFF if drop else ALWAYS_ON).should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return "BoomerangRequestRoots"

    return ParentBased(root=RequestRoots())


def setup_tracing(service_name: str, exporter: Any = None) -> bool:
    """Install a tracer provider for `service_name` when requested; returns whether it did.

    `exporter` (tests) replaces the OTLP exporter and turns tracing on regardless of the
    environment; its spans are exported as each ends.
    """
    global _enabled
    if _enabled or (exporter is None and not tracing_requested()):
        return _enabled
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    processor: SpanProcessor
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)
    elif os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        processor = BatchSpanProcessor(ConsoleSpanExporter())
    else:
        # deferred: OpenTelemetry loads only once tracing is on
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # Batched: a span costs the request a queue append; OTEL_BSP_* tune the flush.
        processor = BatchSpanProcessor(OTLPSpanExporter())
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    # Without OTEL_TRACES_SAMPLER the SDK would trace every background loop (see above).
    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else request_sampler()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}), sampler=sampler)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _instrument_httpx()
    _enabled = True
    return True


def shutdown_tracing() -> None:
    """Flush spans still buffered."""
    if _enabled:
        # deferred: OpenTelemetry loads only once tracing is on
        from opentelemetry import trace

        provider: Any = trace.get_tracer_provider()
        provider.shutdown()


def grpc_server_interceptors() -> list[Any]:
    """Server interceptors that continue the caller's trace (none when tracing is off)."""
    if not _enabled:
        return []
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]  # type: ignore[no-untyped-call]  # the instrumentation is unannotated


def grpc_client_interceptors() -> list[Any]:
    """Client interceptors that propagate the current trace (none when tracing is off)."""
    if not _enabled:
        return []
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())  # type: ignore[no-untyped-call]  # the instrumentation is unannotated


def instrument_engine(engine: Any) -> None:
    """Trace SQL statements of an async SQLAlchemy engine (its sync_engine)."""
    if not _enabled:
        return
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    # The instrumentation declares SQLAlchemy < 2.1 but works with 2.1 (the tests check it),
    # hence skip_dep_check. It is a once-per-process singleton, so an engine after the first
    # (the registry's row-level-security engine) gets its own listener directly.
    instrumentor = SQLAlchemyInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(engine=engine.sync_engine, skip_dep_check=True)
        return
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import metrics, trace
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    usage = metrics.get_meter("boomerang").create_up_down_counter("db.client.connections.usage")
    EngineTracer(  # type: ignore[no-untyped-call]  # the instrumentation is unannotated
        trace.get_tracer("opentelemetry.instrumentation.sqlalchemy"), engine.sync_engine, usage
    )


def asgi_app(app: Any) -> Any:
    """`app` wrapped so each HTTP request is a server span continuing the caller's trace.

    Returns `app` itself when tracing is off. Health probes and scrapes are not traced, and
    the per-message send/receive spans are left out (a streamed answer would make hundreds).
    """
    if not _enabled:
        return app
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(
        app,
        excluded_urls=",".join(p + "$" for p in UNTRACED_PATHS),
        exclude_spans=["receive", "send"],
        default_span_details=_http_span_details,
    )


def _http_span_details(scope: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Name server spans `METHOD /path` (the paths are few and fixed)."""
    return f"{scope.get('method', 'HTTP')} {scope.get('path', '')}", {}


def _instrument_httpx() -> None:
    """Every httpx client in the process makes client spans and injects `traceparent`."""
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry.instrumentation.httpx import (
        HTTPX2ClientInstrumentor,
        HTTPXClientInstrumentor,
    )

    def name_span(span: Any, request: Any) -> None:
        # `POST /tokenize` rather than the bare method: a turn makes several engine calls.
        if span.is_recording():
            method = request.method.decode() if isinstance(request.method, bytes) else str(request.method)
            path = getattr(request.url, "path", "")
            span.update_name(f"{method} {path}".rstrip())

    async def name_async(span: Any, request: Any) -> None:
        name_span(span, request)

    instrumentor = HTTPXClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(request_hook=name_span, async_request_hook=name_async)
    # The gateway talks to engines with httpx2 (httpx's API, a pool that does not rescan every
    # idle connection per request): trace it too.
    second = HTTPX2ClientInstrumentor()
    if not second.is_instrumented_by_opentelemetry:
        second.instrument(request_hook=name_span, async_request_hook=name_async)


def annotate(**attributes: Any) -> None:
    """Set `boomerang.<name>` attributes on the current span (nothing when tracing is off).

    None values are skipped; enum members are recorded by value.
    """
    if not _enabled:
        return
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(
        {f"boomerang.{k}": getattr(v, "value", v) for k, v in attributes.items() if v is not None}
    )


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span `name` with `boomerang.` attributes (a no-op context when tracing is off)."""
    if not _enabled:
        return nullcontext()
    return _span(name, attributes)


@contextmanager
def _span(name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import trace

    tracer = trace.get_tracer("boomerang")
    with tracer.start_as_current_span(
        name, attributes={f"boomerang.{k}": getattr(v, "value", v) for k, v in attributes.items() if v is not None}
    ) as current:
        yield current

