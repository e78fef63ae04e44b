"""A tiny OTLP/gRPC trace receiver for end-to-end tests (built on `opentelemetry-proto`).

Services started with `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:<port>` export their
spans here; the test reads them back as plain `ReceivedSpan`s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsvc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, flattened."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any] = field(hash=False, compare=False)


def _value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class _TraceService(tgrpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver):
        self.sink = sink

    def Export(self, request: tsvc.ExportTraceServiceRequest, context: Any) -> tsvc.ExportTraceServiceResponse:
        received = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self.sink.lock:
            self.sink.spans.extend(received)
        return tsvc.ExportTraceServiceResponse()


class OtlpReceiver:
    """An OTLP trace-service gRPC server on 127.0.0.1 (a free port) collecting spans."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tgrpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        """The value for OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        """Start serving."""
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self.server.stop(grace=None)

    def snapshot(self) -> list[ReceivedSpan]:
        """The spans received so far."""
        with self.lock:
            return list(self.spans)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0) -> list[ReceivedSpan]:
        """Poll until `predicate(spans)` holds or `timeout` passes; returns the spans either way."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.snapshot()
            if predicate(spans):
                return spans
            time.sleep(0.05)
        return self.snapshot()
