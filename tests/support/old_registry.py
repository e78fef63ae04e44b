"""A block registry older than some of its RPCs: the real registry behind a gRPC forwarder
that answers the named methods UNIMPLEMENTED, as a registry built before them would.

It stands for an older real registry during a rolling upgrade (the router upgraded first):
every other unary call is passed through byte for byte, with the caller's metadata, and
the registry's status, message and error details come back unchanged. Streaming methods
are answered UNIMPLEMENTED too (their callers fall back to the unary twins).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc


class OldRegistry(grpc.GenericRpcHandler):
    """Forwards to `upstream` except `missing` methods (names like `CompleteTurn`)."""

    def __init__(self, upstream: str, missing: set[str]):
        self.upstream = grpc.insecure_channel(upstream)
        self.missing = missing
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[self])
        self.address = ""

    def start(self) -> OldRegistry:
        """Listen on a free loopback port (`address`)."""
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        """Stop serving and close the upstream channel."""
        self.server.stop(grace=None)
        self.upstream.close()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        name = details.method.rsplit("/", 1)[-1]  # type: ignore[attr-defined]
        with self._lock:
            self.calls[name] += 1
        if name in self.missing or name.endswith("Stream") or name.startswith("Watch"):
            return None  # grpc answers UNIMPLEMENTED, as for a method the server never had
        return grpc.unary_unary_rpc_method_handler(self._forward(details.method))  # type: ignore[attr-defined]

    def _forward(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call = self.upstream.unary_unary(method)  # bytes in, bytes out

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith("grpc-")
                        and k != "user-agent"]
            try:
                response: bytes
                response, _ = call.with_call(request, metadata=metadata, timeout=context.time_remaining())
                return response
            except grpc.RpcError as err:
                failed: Any = err
                context.set_trailing_metadata(failed.trailing_metadata() or ())
                context.abort(failed.code(), failed.details() or "")
                raise AssertionError("unreachable: abort raises") from None

        return forward
