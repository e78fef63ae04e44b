"""Random and malformed requests to every RPC of every service: only client-error codes.

Requests are generated from the proto descriptors (tests/support/proto_strategies.py) and
sent to the real services as processes. No answer may be INTERNAL or UNKNOWN, and a
rejected request must leave engines, leases and the audit trail exactly as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from boomerang.v1 import reaper_service_pb2, registry_service_pb2, router_service_pb2
from google.protobuf import descriptor_pb2  # noqa: F401 - keeps descriptor pool warm
from hypothesis import HealthCheck, given, settings

from tests.support.databases import fresh_database
from tests.support.procs import ServiceProcess
from tests.support.proto_strategies import messages

pytestmark = pytest.mark.e2e

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
MODULES = {
    "BlockRegistryService": registry_service_pb2,
    "RouterService": router_service_pb2,
    "TTLReaperService": reaper_service_pb2,
}


@pytest.fixture(scope="module")
def addresses(database_url: str) -> Iterator[dict[str, str]]:
    env = {"BOOMERANG_DATABASE_URL": database_url}
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], env).start()
    router = ServiceProcess(["router", "--listen", "127.0.0.1:0", "--registry", registry.address], env).start()
    # The reaper elects its leader in a database of its own: the registry then refuses its
    # fenced writes, so only the fuzzed calls can change the rows this test counts.
    with fresh_database() as reaper_db:
        reaper = ServiceProcess(["reaper", "--listen", "127.0.0.1:0", "--registry", registry.address],
                                {"BOOMERANG_DATABASE_URL": reaper_db}).start()
        try:
            yield {"BlockRegistryService": registry.address, "RouterService": router.address,
                   "TTLReaperService": reaper.address}
        finally:
            for proc in (reaper, router, registry):
                proc.kill()


def row_counts(database_url: str) -> tuple[int, ...]:
    async def count() -> tuple[int, ...]:
        conn = await asyncpg.connect(database_url)
        try:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM engines), (SELECT count(*) FROM leases), "
                "(SELECT count(*) FROM lease_events), (SELECT coalesce(sum(version), 0) FROM leases)"
            )
            return tuple(row)
        finally:
            await conn.close()

    return asyncio.run(count())


CASES = [
    (service_name, method)
    for service_name, module in MODULES.items()
    for method in module.DESCRIPTOR.services_by_name[service_name].methods
    if not method.server_streaming
]


@pytest.mark.parametrize("service_name, method", CASES, ids=[f"{s}.{m.name}" for s, m in CASES])
def test_random_requests_get_client_errors_and_write_nothing(service_name, method, addresses, database_url: str) -> None:  # type: ignore[no-untyped-def]
    module = MODULES[service_name]
    service = module.DESCRIPTOR.services_by_name[service_name]
    request_cls = getattr(module, method.input_type.name)
    response_cls = getattr(module, method.output_type.name)

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(request=messages(method.input_type, request_cls))
    def check(request) -> None:  # type: ignore[no-untyped-def]
        with grpc.insecure_channel(addresses[service_name]) as channel:
            call = channel.unary_unary(
                f"/{service.full_name}/{method.name}",
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            before = row_counts(database_url)
            try:
                call(request, timeout=15)
            except grpc.RpcError as err:
                assert err.code() in ALLOWED, f"{method.name} answered {err.code()}: {err.details()} for {request}"
                assert row_counts(database_url) == before, f"rejected {method.name} wrote rows: {request}"

    check()
