"""OpenTelemetry set-up shared by every service.

Tracing is off unless the standard variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
`OTEL_TRACES_EXPORTER=otlp|console`); then spans go out over OTLP/gRPC, gRPC servers and
clients carry W3C trace context, and SQLAlchemy statements become spans. Custom attributes
are prefixed `boomerang.`.
"""

from __future__ import annotations

import os
from typing import Any

_enabled = False


def tracing_requested() -> bool:
    """Whether the environment asks for traces."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if exporter == "none" or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(exporter or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup_tracing(service_name: str) -> bool:
    """Install a tracer provider for `service_name` when requested; returns whether it did."""
    global _enabled
    if _enabled or not tracing_requested():
        return _enabled
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def shutdown_tracing() -> None:
    """Flush spans still buffered."""
    if _enabled:
        from opentelemetry import trace

        provider: Any = trace.get_tracer_provider()
        provider.shutdown()


def grpc_server_interceptors() -> list[Any]:
    """Server interceptors that continue the caller's trace (none when tracing is off)."""
    if not _enabled:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]


def grpc_client_interceptors() -> list[Any]:
    """Client interceptors that propagate the current trace (none when tracing is off)."""
    if not _enabled:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())


def instrument_engine(engine: Any) -> None:
    """Trace SQL statements of an async SQLAlchemy engine (its sync_engine)."""
    if not _enabled:
        return
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine)
