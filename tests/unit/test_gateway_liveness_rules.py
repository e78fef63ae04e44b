"""Which registry engines a healthy static engine vouches for."""

from __future__ import annotations

from boomerang.v1 import types_pb2 as tpb
from boomerang_gateway.engine_routing import DECODE, PREFILL, EngineRef
from boomerang_gateway.liveness import vouchable
from google.protobuf.timestamp_pb2 import Timestamp


def engine(engine_id: str, url: str, registered: int, model: str = "m", role: int = tpb.ENGINE_ROLE_DECODE,
           status: int = tpb.ENGINE_STATUS_ACTIVE) -> tpb.Engine:
    return tpb.Engine(engine_id=engine_id, role=role, model=model, http_base_url=url, status=status,
                      register_time=Timestamp(seconds=registered), registration_generation=1)


def test_only_the_latest_active_registration_at_a_healthy_url_serving_its_model() -> None:
    healthy = EngineRef("http://d:8200", DECODE, "http://d:8200", ("m",))
    down = EngineRef("http://d2:8200", DECODE, "http://d2:8200", ("m",), healthy=False)
    prefill = EngineRef("http://p:8100", PREFILL, "http://p:8100", ("m",))
    listed = [
        engine("old", "http://d:8200", 100),
        engine("new", "http://d:8200/", 200),  # restarted: a new id at the same URL
        engine("gone", "http://d2:8200", 300),  # its engine failed the probe
        engine("p-as-decode", "http://p:8100", 100),  # a role this URL does not serve
        engine("elsewhere", "http://x:8200", 100),
    ]
    got = vouchable(listed, [healthy, down, prefill])
    assert [(e.engine_id, ref.url) for e, ref in got] == [("new", "http://d:8200")]
    assert vouchable([engine("other-model", "http://d:8200", 100, model="n")], [healthy]) == []
    # The latest registration is dead (the reaper judged it): the older one is not revived.
    dead = [engine("old", "http://d:8200", 100), engine("new", "http://d:8200", 200, status=tpb.ENGINE_STATUS_DEAD)]
    assert vouchable(dead, [healthy]) == []


def test_never_a_registration_older_than_the_last_failed_probe() -> None:
    healthy = EngineRef("http://d:8200", DECODE, "http://d:8200", ("m",))
    key = (tpb.ENGINE_ROLE_DECODE, "http://d:8200")
    before = [engine("before-restart", "http://d:8200", 100)]
    assert vouchable(before, [healthy], {key: 150.0}) == []  # restarted: the old blocks are gone
    after = [*before, engine("after-restart", "http://d:8200", 200)]
    assert [e.engine_id for e, _ in vouchable(after, [healthy], {key: 150.0})] == ["after-restart"]
