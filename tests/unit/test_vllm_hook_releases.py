"""D's hook and releases: taken in the decode engine's own heartbeats, applied on the
scheduler thread only for turns vLLM still holds (tests/vllm checks vLLM's side)."""

from __future__ import annotations

from typing import Any

from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_vllm_hook.releases import ReleaseInbox
from boomerang_vllm_hook.sender import EngineFacts, EnginePresence

from tests.support.hook_fakes import FakeRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def facts(role: Any) -> EngineFacts:
    return EngineFacts(engine_id=f"{role}-1", role=role, model="m", block_size=16, kv_blocks_ttl_seconds=480,
                       kv_recompute_threshold=64)


class ReleasingRegistry(FakeRegistry):
    def __init__(self, released: list[str]) -> None:
        super().__init__()
        self.released = released

    def heartbeat(self, req: rpb.HeartbeatRequest, timeout: float | None = None) -> rpb.HeartbeatResponse:
        super().heartbeat(req, timeout)
        out = [rpb.ReleasedTurn(remote_request_id=r, state=tpb.LEASE_STATE_SUPERSEDED) for r in self.released]
        self.released = []
        return rpb.HeartbeatResponse(engine=tpb.Engine(engine_id=req.engine_id), released=out if req.take_releases else [])


def test_only_held_turns_are_released_once() -> None:
    clock = Clock()
    inbox = ReleaseInbox(clock)
    inbox.pin("a", 580.0, 10)
    inbox.pin("b", 580.0, 5)
    inbox.pin("due", 100.0, 3)
    inbox.receive(["a", "ghost", "due"])
    assert inbox.take() == ["a"]
    assert inbox.take() == []  # once
    assert inbox.counters == {"releases_received": 3, "releases_applied": 1, "released_blocks": 10,
                              "releases_not_held": 1, "releases_already_due": 1}
    inbox.freed(["b"])  # P read it: vLLM freed it, so a release must never reach vLLM
    inbox.receive(["b"])
    assert inbox.take() == []
    inbox.receive(["a", "due"])  # both stay pinned (deadline now, or past) until vLLM reports them
    assert inbox.take() == [] and inbox.counters["releases_already_due"] == 3


def test_decode_heartbeats_take_releases_and_report_memory() -> None:
    got: list[list[str]] = []
    registry = ReleasingRegistry(["r1", "r2"])
    clock = Clock()
    presence = EnginePresence(registry, facts("decode"), rpc_timeout=1, heartbeat_interval=0.5, clock=clock,  # type: ignore[arg-type]
                              memory=lambda: (300, 1000), on_released=got.append)
    assert presence.tick()  # registers
    clock.now += 1
    presence.tick()
    sent = [req for name, req in registry.calls if name == "Heartbeat"][-1]
    assert (sent.take_releases, sent.free_kv_blocks, sent.total_kv_blocks) == (True, 300, 1000)
    assert got == [["r1", "r2"]] and presence.released == 2


def test_prefill_heartbeats_leave_releases() -> None:
    got: list[list[str]] = []
    registry = ReleasingRegistry(["r1"])
    clock = Clock()
    presence = EnginePresence(registry, facts("prefill"), rpc_timeout=1, heartbeat_interval=0.5, clock=clock,  # type: ignore[arg-type]
                              on_released=got.append)
    presence.tick()
    clock.now += 1
    presence.tick()
    sent = [req for name, req in registry.calls if name == "Heartbeat"][-1]
    assert not sent.take_releases and got == []
