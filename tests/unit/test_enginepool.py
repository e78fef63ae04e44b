"""The shared engine pool: the registry's snapshot, static specs, health and who may serve (model, role)."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_gateway.engine_routing import DECODE, PREFILL, EngineRouting
from boomerang_server.enginepool import (
    EngineTable,
    Progress,
    RegistryRefresher,
    Role,
    Source,
    engine_info,
    parse_static,
    progressed,
    static_specs,
)
from google.protobuf.timestamp_pb2 import Timestamp


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_800_000_000.0


def proto(engine_id: str, role: Any, clock: Clock, model: str = "m", ago: float = 0.0, **kw: Any) -> tpb.Engine:
    kw.setdefault("http_base_url", f"http://{engine_id}:8000/")
    kw.setdefault("status", tpb.ENGINE_STATUS_ACTIVE)
    return tpb.Engine(engine_id=engine_id, role=role, model=model, registration_generation=kw.pop("generation", 1),
                      heartbeat_time=Timestamp(seconds=int(clock.wall - ago)), **kw)


class Registry:
    """ListEngines from a list the test sets; raises while `down`."""

    def __init__(self) -> None:
        self.engines: list[tpb.Engine] = []
        self.down = False
        self.closed = 0

    async def list_engines(self, req: rpb.ListEnginesRequest, timeout: float) -> rpb.ListEnginesResponse:
        if self.down:
            raise ConnectionError("registry down")
        return rpb.ListEnginesResponse(engines=self.engines)

    async def close(self) -> None:
        self.closed += 1


def table(clock: Clock, timeout: float = 30.0) -> EngineTable:
    return EngineTable(heartbeat_timeout=timeout, mono=lambda: clock.mono, wall=lambda: clock.wall)


def ids(entries: Any) -> list[str]:
    return [e.info.engine_id for e in entries]


async def test_a_failed_refresh_keeps_the_last_good_view() -> None:
    clock, registry = Clock(), Registry()
    t = table(clock)
    refresher = RegistryRefresher(t, registry)  # type: ignore[arg-type]
    registry.engines = [proto("d1", tpb.ENGINE_ROLE_DECODE, clock)]
    assert await refresher.refresh() and t.refreshed
    registry.down = True
    assert not await refresher.refresh()
    assert ids(t.candidates("m", Role.DECODE)) == ["d1"] and refresher.failures == 1
    assert registry.closed == 0  # the caller's client: not closed
    registry.down, registry.engines = False, []
    assert await refresher.refresh() and t.candidates("m", Role.DECODE) == [] and refresher.failures == 0


async def test_a_refresher_with_a_factory_reconnects_after_a_failure() -> None:
    made: list[Registry] = []

    def new() -> Registry:
        made.append(Registry())
        return made[-1]

    t = table(Clock())
    refresher = RegistryRefresher(t, new(), reconnect=new)  # type: ignore[arg-type]
    made[0].down = True
    assert not await refresher.refresh()
    fresh: Any = refresher.registry
    assert made[0].closed == 1 and fresh is made[1]
    await refresher.close()
    assert made[1].closed == 1


def test_the_registry_alone_judges_death_and_generation() -> None:
    clock = Clock()
    t = table(clock)
    t.apply_registry_snapshot(i for i in map(engine_info, [
        proto("d-dead", tpb.ENGINE_ROLE_DECODE, clock, status=tpb.ENGINE_STATUS_DEAD),
        proto("d-old", tpb.ENGINE_ROLE_DECODE, clock, ago=120),
        proto("d-nourl", tpb.ENGINE_ROLE_DECODE, clock, http_base_url=""),
        proto("d-ok", tpb.ENGINE_ROLE_DECODE, clock, generation=4),
        proto("d-other", tpb.ENGINE_ROLE_DECODE, clock, model="n"),
        proto("p-ok", tpb.ENGINE_ROLE_PREFILL, clock),
        proto("unknown-role", 0, clock),
    ]) if i is not None)
    reasons = {e.info.engine_id: e.unavailable_reason for e in t.candidates("m", Role.DECODE)}
    assert reasons == {"d-dead": "DEAD", "d-old": "HEARTBEAT_STALE", "d-nourl": "NO_HTTP_BASE_URL", "d-ok": ""}
    assert ids(t.candidates("m", Role.PREFILL)) == ["p-ok"] and ids(t.candidates("n", Role.DECODE)) == ["d-other"]
    ok = t.known("d-ok")
    assert ok is not None and ok.http_base_url == "http://d-ok:8000" and ok.generation == 4 and ok.source is Source.REGISTRY
    assert t.source_alive("d-ok", 4) and not t.source_alive("d-ok", 3)
    assert not t.source_alive("d-dead", 1) and not t.source_alive("d-old", 1) and t.source_alive("never-seen", 1)
    assert ids(t.entries(role=Role.PREFILL)) == ["p-ok"] and len(t.entries(model="m")) == 5


def test_heartbeat_progress_is_judged_on_this_process_clock() -> None:
    first = progressed(None, 960.0, mono=100.0, wall=1000.0)
    assert first == Progress(960.0, 60.0)  # first sight: 40 s old by the wall clocks
    assert progressed(first, 960.0, mono=500.0, wall=5000.0) is first  # not advanced: unchanged
    assert progressed(first, 961.0, mono=500.0, wall=5000.0) == Progress(961.0, 500.0)  # advanced: now
    assert progressed(None, None, mono=100.0, wall=1000.0) == Progress(None, 100.0)  # never beat: no age


def test_static_engines_win_serve_their_models_and_follow_health() -> None:
    t = table(Clock())
    t.apply_registry_snapshot([engine_info(proto("p-reg", tpb.ENGINE_ROLE_PREFILL, Clock()))])  # type: ignore[list-item]
    t.set_static([parse_static("http://a:1/", Role.PREFILL), parse_static("b=http://b:1", Role.PREFILL),
                  parse_static("http://a:1", Role.DECODE)])
    assert ids(t.candidates("any", Role.PREFILL)) == ["http://a:1", "b"]  # models not asked: any
    assert ids(t.candidates("m", Role.DECODE)) == ["http://a:1"]  # one URL in both roles: two engines
    t.set_static_health("b", True, ("m",))
    assert ids(t.candidates("other", Role.PREFILL)) == ["http://a:1"]
    t.set_static_health("http://a:1", False)
    assert [e.unavailable_reason for e in t.candidates("m", Role.PREFILL)] == ["HEALTH_CHECK_FAILED", ""]
    assert [e.available for e in t.candidates("m", Role.DECODE)] == [False]


def test_one_static_spec_syntax_for_both_services() -> None:
    assert parse_static(" http://h:1/ ", Role.DECODE).engine_id == "http://h:1"
    named = parse_static("p1=https://h:1/v", Role.PREFILL)
    assert (named.engine_id, named.http_base_url, named.source) == ("p1", "https://h:1/v", Source.STATIC)
    assert parse_static("http://h:1/?a=b", Role.PREFILL).http_base_url == "http://h:1/?a=b"  # an = in the URL
    assert static_specs("http://a:1/, p2=http://b:2/,,") == ["http://a:1", "p2=http://b:2"]
    assert static_specs(["p1=http://a:1", "http://b:2"]) == ["p1=http://a:1", "http://b:2"]
    assert static_specs(None) == []
    for bad in ("ftp://x", "p3=ftp://x", "h:1", "p=h:1"):
        with pytest.raises(ValueError, match="URL or NAME=URL"):
            static_specs(bad)


def test_a_refused_url_is_skipped_for_a_while() -> None:
    clock = Clock()
    t = table(clock)
    t.mark_down("http://a:1", 5.0)
    assert t.is_down("http://a:1") and not t.is_down("http://b:1")
    clock.mono += 5.0
    assert not t.is_down("http://a:1")


async def test_the_gateway_keeps_stale_engines_only_where_a_model_has_no_fresh_one() -> None:
    clock, registry = Clock(), Registry()
    pool = EngineRouting(httpx.AsyncClient(), [], [], lambda: registry, refresh_seconds=60)  # type: ignore[arg-type, return-value]
    pool.table.mono, pool.table.wall = (lambda: clock.mono), (lambda: clock.wall)
    registry.engines = [
        proto("p-fresh", tpb.ENGINE_ROLE_PREFILL, clock),
        proto("p-stale", tpb.ENGINE_ROLE_PREFILL, clock, ago=120),
        proto("p-stale-n", tpb.ENGINE_ROLE_PREFILL, clock, model="n", ago=120),
        proto("d-dead", tpb.ENGINE_ROLE_DECODE, clock, status=tpb.ENGINE_STATUS_DEAD),
        proto("d-nourl", tpb.ENGINE_ROLE_DECODE, clock, http_base_url=""),
    ]
    await pool.refresh()
    assert pool.refreshed and pool.source == "registry"
    assert sorted(e.engine_id for e in pool.engines) == ["p-fresh", "p-stale-n"]
    assert [c["id"] for c in pool.models()] == ["m", "n"] and pool.choose(DECODE, "m") is None
    assert pool.servable() == 0  # listed, but no decode engine: /health says it serves nothing yet
    registry.engines.append(proto("d-fresh", tpb.ENGINE_ROLE_DECODE, clock))
    await pool.refresh()
    assert pool.servable() == 1 and pool.choose(DECODE, "m") is not None
    await pool.stop()


async def test_a_turn_that_spans_a_refresh_counts_itself_off_the_engine_the_next_choice_reads() -> None:
    clock, registry = Clock(), Registry()
    pool = EngineRouting(httpx.AsyncClient(), [], [], lambda: registry, refresh_seconds=60)  # type: ignore[arg-type, return-value]
    registry.engines = [proto("p1", tpb.ENGINE_ROLE_PREFILL, clock), proto("p2", tpb.ENGINE_ROLE_PREFILL, clock)]
    await pool.refresh()
    busy = pool.find(PREFILL, "http://p1:8000")
    busy.in_flight += 1  # a turn starts
    await pool.refresh()
    assert pool.choose(PREFILL, "m").engine_id == "p2"  # type: ignore[union-attr]
    busy.in_flight -= 1  # ...and ends after the refresh
    await pool.refresh()
    assert pool.find(PREFILL, "http://p1:8000") is busy and busy.in_flight == 0
    await pool.stop()
