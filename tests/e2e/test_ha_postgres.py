"""The whole stack on a highly available Postgres (Patroni on etcd, three nodes): a switchover and then
a failover (the primary's host killed) under traffic; every request succeeds, the services find the
new primary by themselves through the multi-host URL, and reuse comes back."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from boomerang_tools.stack.ha_postgres import HaPostgres
from boomerang_tools.stack.postgres import system_binaries
from boomerang_tools.stack.stack import Stack, StackConfig, sims_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL = "Qwen/Qwen3-32B"


@pytest.fixture
def stack() -> Iterator[Stack]:
    if shutil.which("etcd") is None or system_binaries() is None:
        pytest.skip("etcd or the system's PostgreSQL is not installed (.ci/run installs both)")
    folder = Path(tempfile.mkdtemp(prefix="boomerang-ha-test-"))
    s = Stack(StackConfig(data_dir=folder, gateway_port=0, grpc_ports=(0, 0, 0), sims=sims_for("1x1", "qwen3-32b", 0, 0),
                          time_scale=0.0, ha_nodes=3))
    try:
        s.start()
        yield s
    finally:
        s.stop()
        shutil.rmtree(folder, ignore_errors=True)


class Conversation:
    """One conversation's turns, each recorded as (status, plan)."""

    def __init__(self, url: str):
        self.url = url
        self.id = f"ha-{uuid.uuid4().hex[:8]}"
        self.history = [{"role": "system", "content": "You are an agent. " * 60}]
        self.turns: list[tuple[int, str]] = []

    def turn(self, http: httpx.Client) -> str:
        self.history.append({"role": "user", "content": f"Turn {len(self.history)}: " + "do the next step. " * 10})
        resp = http.post(self.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": self.history, "max_tokens": 8, "conversation_id": self.id})
        plan = resp.headers.get("x-boomerang-plan", "")
        self.turns.append((resp.status_code, plan))
        assert resp.status_code == 200, resp.text
        self.history.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
        return plan

    def until_pull(self, http: httpx.Client, seconds: float) -> float:
        """Turns until one PULLs; the seconds that took (fails past `seconds`)."""
        started = time.monotonic()
        while self.turn(http) != "PULL":
            assert time.monotonic() - started < seconds, self.turns
            time.sleep(0.3)
        return time.monotonic() - started


def test_services_follow_a_switchover_and_a_failover(stack: Stack) -> None:
    ha = stack.ha
    assert isinstance(ha, HaPostgres)
    first = ha.wait_primary()
    with httpx.Client(timeout=60) as http:
        conv = Conversation(stack.gateway_url)
        conv.turn(http)
        assert conv.turn(http) == "PULL"

        assert ha.switchover()
        second = ha.wait_primary(60)
        assert second is not first
        conv.until_pull(http, 30)

        ha.kill_node(second)
        third = ha.wait_primary(90)
        assert third is not second
        # Patroni's leader key outlives a dead primary by up to its TTL (20 s).
        conv.until_pull(http, 90)
        ha.start_node(second)  # the old primary rejoins as a standby (pg_rewind)
        ha.wait_streaming(90)
        conv.until_pull(http, 30)
    assert all(status == 200 for status, _ in conv.turns), conv.turns
