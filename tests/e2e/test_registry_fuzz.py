"""Random and malformed requests to every registry RPC: only client-error codes, no writes.

Requests are generated from the proto descriptors (tests/support/proto_strategies.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc
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
SERVICE = rpb.DESCRIPTOR.services_by_name["BlockRegistryService"]


@pytest.fixture(scope="module")
def channel(database_url: str) -> Iterator[grpc.Channel]:
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    with grpc.insecure_channel(proc.address) as ch:
        yield ch
    proc.kill()


def row_counts(database_url: str) -> tuple[int, int, int]:
    async def count() -> tuple[int, int, int]:
        conn = await asyncpg.connect(database_url)
        try:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM engines), (SELECT count(*) FROM leases), (SELECT count(*) FROM lease_events)"
            )
            return tuple(row)  # type: ignore[return-value]
        finally:
            await conn.close()

    return asyncio.run(count())


@pytest.mark.parametrize("method", [m for m in SERVICE.methods if not m.server_streaming], ids=lambda m: m.name)
def test_random_requests_get_client_errors_and_write_nothing(method, channel: grpc.Channel, database_url: str) -> None:  # type: ignore[no-untyped-def]
    request_cls = getattr(rpb, method.input_type.name)
    response_cls = getattr(rpb, method.output_type.name)
    call = channel.unary_unary(
        f"/{SERVICE.full_name}/{method.name}",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(request=messages(method.input_type, request_cls))
    def check(request) -> None:  # type: ignore[no-untyped-def]
        before = row_counts(database_url)
        try:
            call(request, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
            assert code in ALLOWED, f"{method.name} answered {code}: {err.details()} for {request}"
            assert row_counts(database_url) == before, f"rejected {method.name} wrote rows: {request}"
        assert code in ALLOWED

    check()
