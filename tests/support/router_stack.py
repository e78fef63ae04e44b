"""A registry and a router as real processes (`boomerang registry`, `boomerang router`) on a
test database, for the end-to-end tests that talk gRPC to them, and the turn data those
tests report with."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.procs import ServiceProcess

BS = 16


@contextmanager
def running_registry(database_url: str) -> Iterator[ServiceProcess]:
    """A started registry on `database_url`, killed when the block ends."""
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    try:
        yield proc
    finally:
        proc.kill()


@contextmanager
def running_router(database_url: str, registry: str, *, patient: bool = True) -> Iterator[ServiceProcess]:
    """A started router behind the registry at `registry`, refreshing its engine pool every 0.2 s;
    killed when the block ends.

    `patient`: claims may take 2 s (every process shares two cores) and engines stay in the pool
    without heartbeats, as the tests register them by hand and never beat.
    """
    args = ["router", "--listen", "127.0.0.1:0", "--registry", registry, "--engine-refresh-seconds", "0.2"]
    if patient:
        args += ["--claim-deadline-ms", "2000", "--heartbeat-timeout-seconds", "0"]
    proc = ServiceProcess(args, {"BOOMERANG_DATABASE_URL": database_url}).start()
    try:
        yield proc
    finally:
        proc.kill()


def history(n: int, seed: int) -> list[int]:
    """`n` token ids, the same for the same seed."""
    return [(seed * 1_000_003 + i * 7919) % 150_000 for i in range(n)]


def handle(engine_id: str, num_tokens: int) -> str:
    """A decode engine's pull handle for `num_tokens` tokens held on `engine_id`, as the hook reports it."""
    return json.dumps({
        "do_remote_decode": True, "do_remote_prefill": False,
        "remote_block_ids": [list(range(100, 100 + -(-num_tokens // BS)))],
        "remote_engine_id": engine_id, "remote_request_id": f"cmpl-{uuid.uuid4().hex}",
        "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
        "remote_num_tokens": num_tokens, "remote_registration_generation": 1, "transfer_mode": "pull",
    })
