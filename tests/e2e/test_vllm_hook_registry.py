"""The decode hook's sender against a real registry that restarts, and with credentials."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from boomerang.clients.sync import SyncRegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_vllm_hook.connector import BoomerangConnectorMixin

from tests.support.procs import BOOMERANG, ServiceProcess, wait_for
from tests.support.vllm_standin import (
    KVConnectorRole,
    Request,
    StandInNixlConnector,
    block_ids_for,
    vllm_config,
)

pytestmark = pytest.mark.e2e


class Connector(BoomerangConnectorMixin, StandInNixlConnector):
    """What `BoomerangConnector` is inside vLLM, over the stand-in."""


def decode(engine_id: str, registry: str, tenant: str, **more: Any) -> Connector:
    cfg = {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64,
           "boomerang": {"role": "decode", "registry": registry, "tenant": tenant, "rpc_timeout_seconds": 0.5,
                         "heartbeat_interval_seconds": 0.5, **more}}
    return Connector(vllm_config(engine_id, cfg), KVConnectorRole.SCHEDULER)


def finish(conn: Connector, rid: str, conversation: str) -> None:
    req = Request(rid, list(range(64)), {"do_remote_prefill": True, "boomerang": {"conversation_id": conversation}},
                  output_token_ids=list(range(900, 940)), status="FINISHED_STOPPED")
    _, handle = conn.request_finished_all_groups(req, block_ids_for(104, 16))
    assert handle is not None


def conversation(address: str, tenant: str, conv: str, token: str = "") -> rpb.GetConversationResponse:
    with SyncRegistryClient(address, auth_token=token) as client:
        return client.get_conversation(rpb.GetConversationRequest(tenant=tenant, conversation_id=conv, include_events=True))


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        thing.shutdown() if isinstance(thing, Connector) else thing.kill()


def test_registration_survives_a_registry_restart(database_url: str, unique: str, cleanup: list[Any]) -> None:
    env = {"BOOMERANG_DATABASE_URL": database_url}
    first = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], env).start()
    cleanup.append(first)
    tenant, conv = f"t-{unique}", f"c-{unique}"
    d = decode(f"d-{unique}", first.address, tenant)
    cleanup.append(d)
    assert d.boomerang is not None and d.boomerang.sender is not None
    sender = d.boomerang.sender
    assert wait_for(lambda: sender.presence.registered, 10)

    first.kill()  # SIGKILL: no drain
    finish(d, "turn-1", conv)  # the turn ends while the registry is down
    assert wait_for(lambda: sender.transient_failures >= 2, 10), sender.snapshot()
    assert sender.registered == 0

    second = ServiceProcess(["registry", "--listen", first.address], env).start()  # same port
    cleanup.append(second)
    assert wait_for(lambda: sender.registered == 1, 15), sender.snapshot()
    got = conversation(second.address, tenant, conv)
    assert len(got.leases) == 1 and got.leases[0].remote_request_id == "turn-1"
    assert got.leases[0].state == tpb.LEASE_STATE_RETAINED and got.leases[0].num_tokens == 103  # all but the last sampled token
    assert [e.reason for e in got.events] == ["REGISTERED"]  # exactly once
    # The engine kept heartbeating through the restart and is live.
    assert wait_for(lambda: sender.presence.heartbeats >= 2, 5)
    snap = sender.snapshot()
    assert snap["expired"] == 0 and snap["dropped_full"] == 0 and snap["rejected"] == {}


def create_token(database_url: str, principal: str) -> str:
    out = subprocess.run([BOOMERANG, "credentials", "create", principal, "--database-url", database_url],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()[1]


def test_engine_credentials(database_url: str, unique: str, cleanup: list[Any]) -> None:
    secured = ServiceProcess(["registry", "--listen", "127.0.0.1:0"],
                             {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"}).start()
    cleanup.append(secured)
    engine_id, tenant = f"d-{unique}", f"t-{unique}"
    token = create_token(database_url, f"engine:{engine_id}")
    service = create_token(database_url, "service:ops")

    # With its own engine token the hook registers the engine and its turns.
    d = decode(engine_id, secured.address, tenant, auth_token=token)
    cleanup.append(d)
    finish(d, "turn-1", f"c-{unique}")
    assert wait_for(lambda: d.boomerang.sender.registered == 1, 10), d.boomerang.stats()
    assert len(conversation(secured.address, tenant, f"c-{unique}", service).leases) == 1

    # Another engine's token is refused; the hook counts it and keeps the scheduler going.
    impostor = decode(f"x-{unique}", secured.address, tenant, auth_token=token)
    cleanup.append(impostor)
    assert wait_for(lambda: impostor.boomerang.sender.presence.failures >= 1, 10)
    assert not impostor.boomerang.sender.presence.registered
    begin = time.perf_counter()
    finish(impostor, "turn-1", f"c2-{unique}")
    assert time.perf_counter() - begin < 0.05
