"""Typed blocking clients for the registry and the router, for callers without an event loop.

vLLM's scheduler calls its KV-connector hooks synchronously, so the vLLM hook cannot await;
these clients mirror `boomerang.clients.registry` and the router's async client with plain
blocking calls (and `*_future` variants that let one thread keep a batch in flight). Same
contract as the async clients: a deadline on every call, transparent retries of UNAVAILABLE
only (every Boomerang RPC is idempotent by request id or natural key), and one typed error,
`BoomerangClientError`.

Credentials work as for the async clients (`boomerang.auth`): a bearer token sent as
`authorization: Bearer <token>` on every call, and TLS (mutual when a client certificate is
given). Both default to the process's `BOOMERANG_AUTH_TOKEN` and `BOOMERANG_TLS_*`
variables; pass `auth_token`/`tls` to override them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self, TypeVar

import grpc

from boomerang.auth import TlsFiles, client_token
from boomerang.clients.base import BoomerangClientError
from boomerang.grpcutil import from_rpc_error, sync_channel
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc
from boomerang.v1 import router_service_pb2 as opb
from boomerang.v1 import router_service_pb2_grpc as ogrpc

T = TypeVar("T")


def result(method: str, future: Any) -> Any:
    """The response of a `*_future` call (a `grpc.Future`), or BoomerangClientError."""
    try:
        return future.result()
    except grpc.RpcError as err:
        raise BoomerangClientError(method, from_rpc_error(err)) from None


class SyncClient:
    """What both blocking clients share: the channel, default deadline and credentials."""

    service = ""  # the gRPC service, e.g. "boomerang.v1.RouterService"
    stub_class: Any = None  # its generated stub

    def __init__(
        self,
        target: str,
        timeout: float = 5.0,
        *,
        auth_token: str | None = None,
        tls: TlsFiles | None = None,
        retries: bool = True,
    ):
        self.target = target
        self.timeout = timeout
        tls = TlsFiles.from_env() if tls is None else tls
        auth_token = client_token() if auth_token is None else auth_token
        self.channel = sync_channel(target, [self.service], retries=retries, tls=tls)
        self.stub = self.stub_class(self.channel)
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
        )

    def close(self) -> None:
        """Close the channel; calls in flight fail with CANCELLED."""
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, fn: Callable[..., T], request: Any, timeout: float | None) -> T:
        try:
            return fn(request, timeout=self.timeout if timeout is None else timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise BoomerangClientError(method, from_rpc_error(err)) from None

    def _future(self, fn: Any, request: Any, timeout: float | None) -> grpc.Future[Any]:
        return fn.future(request, timeout=self.timeout if timeout is None else timeout, metadata=self.metadata)


class SyncRegistryClient(SyncClient):
    """BlockRegistryService with blocking calls, per-call deadlines (seconds), one error type."""

    service = "boomerang.v1.BlockRegistryService"
    stub_class = rgrpc.BlockRegistryServiceStub

    def register_engine(self, req: rpb.RegisterEngineRequest, timeout: float | None = None) -> rpb.RegisterEngineResponse:
        return self._call("RegisterEngine", self.stub.RegisterEngine, req, timeout)

    def heartbeat(self, req: rpb.HeartbeatRequest, timeout: float | None = None) -> rpb.HeartbeatResponse:
        return self._call("Heartbeat", self.stub.Heartbeat, req, timeout)

    def register_retained_blocks_batch_future(
        self, req: rpb.RegisterRetainedBlocksBatchRequest, timeout: float | None = None
    ) -> grpc.Future[rpb.RegisterRetainedBlocksBatchResponse]:
        """RegisterRetainedBlocksBatch without waiting; read it with `result("RegisterRetainedBlocksBatch", f)`."""
        return self._future(self.stub.RegisterRetainedBlocksBatch, req, timeout)

    def invalidate_engine(
        self, req: rpb.InvalidateEngineRequest, timeout: float | None = None
    ) -> rpb.InvalidateEngineResponse:
        return self._call("InvalidateEngine", self.stub.InvalidateEngine, req, timeout)

    def get_conversation(
        self, req: rpb.GetConversationRequest, timeout: float | None = None
    ) -> rpb.GetConversationResponse:
        return self._call("GetConversation", self.stub.GetConversation, req, timeout)

    def watch_lease_keys(self, watcher: str) -> Any:
        """The lease-keys stream: an iterator of WatchLeaseKeysResponse (no deadline; `cancel()`
        ends it). Its errors are grpc.RpcError, raised while iterating."""
        return self.stub.WatchLeaseKeys(rpb.WatchLeaseKeysRequest(watcher=watcher), metadata=self.metadata)


class SyncRouterClient(SyncClient):
    """RouterService with blocking calls, per-call deadlines (seconds), one error type."""

    service = "boomerang.v1.RouterService"
    stub_class = ogrpc.RouterServiceStub

    def plan_turn(self, req: opb.PlanTurnRequest, timeout: float | None = None) -> opb.PlanTurnResponse:
        return self._call("PlanTurn", self.stub.PlanTurn, req, timeout)

    def plan_turn_future(self, req: opb.PlanTurnRequest, timeout: float | None = None) -> grpc.Future[opb.PlanTurnResponse]:
        """PlanTurn without waiting; read it with `result("PlanTurn", f)`."""
        return self._future(self.stub.PlanTurn, req, timeout)

    def report_turn(self, req: opb.ReportTurnRequest, timeout: float | None = None) -> opb.ReportTurnResponse:
        return self._call("ReportTurn", self.stub.ReportTurn, req, timeout)

    def report_turn_batch_future(
        self, req: opb.ReportTurnBatchRequest, timeout: float | None = None
    ) -> grpc.Future[opb.ReportTurnBatchResponse]:
        """ReportTurnBatch without waiting; read it with `result("ReportTurnBatch", f)`."""
        return self._future(self.stub.ReportTurnBatch, req, timeout)

    def list_engines(
        self, req: opb.RouterServiceListEnginesRequest, timeout: float | None = None
    ) -> opb.RouterServiceListEnginesResponse:
        return self._call("ListEngines", self.stub.ListEngines, req, timeout)
