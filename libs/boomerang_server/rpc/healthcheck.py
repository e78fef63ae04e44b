"""`python -m boomerang_server.rpc.healthcheck HOST:PORT [SERVICE]`: exit 0 when SERVING.

For container healthchecks; it uses the same TLS settings (`BOOMERANG_TLS_*`) as every
Boomerang client, so it works against servers that require mutual TLS.
"""

from __future__ import annotations

import asyncio
import sys

from boomerang.grpcutil import aio_channel
from grpc_health.v1 import health_pb2, health_pb2_grpc


async def check(target: str, service: str = "", timeout: float = 3.0) -> bool:
    """Whether `service` at `target` reports SERVING."""
    async with aio_channel(target, []) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m boomerang_server.rpc.healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    try:
        return 0 if asyncio.run(check(args[0], args[1] if len(args) > 1 else "")) else 1
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
