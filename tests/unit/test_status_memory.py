"""`boomerang status`'s decode memory figures from the leases the API lists."""

from __future__ import annotations

from boomerang.v1 import types_pb2 as tpb
from boomerang_cli.status import block_seconds_from_leases, memory_section, render_memory


def lease(lid: str, engine: str, blocks: int, state: int, created: float, updated: float) -> tpb.Lease:
    msg = tpb.Lease(lease_id=lid, engine_id=engine, state=state,
                    block_groups=[tpb.BlockIdGroup(block_ids=list(range(blocks)))])
    msg.create_time.FromNanoseconds(int(created * 1e9))
    msg.update_time.FromNanoseconds(int(updated * 1e9))
    return msg


def test_block_seconds_clip_to_the_window_and_end_with_the_lease() -> None:
    live = lease("a", "d1", 10, tpb.LEASE_STATE_RETAINED, created=50.0, updated=50.0)  # before the window: clipped
    released = lease("b", "d1", 4, tpb.LEASE_STATE_RELEASED, created=120.0, updated=130.0)
    gone = lease("c", "d2", 8, tpb.LEASE_STATE_EXPIRED, created=10.0, updated=90.0)  # ended before the window
    # `live` listed twice (the live scan and the recent one) counts once.
    got = block_seconds_from_leases([live, released, gone, live], since=100.0, now=200.0)
    assert got == {"d1": 10 * 100.0 + 4 * 10.0}


def test_memory_section_lists_decode_engines_and_releases_in_order() -> None:
    retained = [{"engine_id": "d1", "blocks": 10, "bytes": None}, {"engine_id": "d2", "blocks": 0, "bytes": None}]
    m = memory_section(retained, {"d1": 1040.0}, {"EXPIRED": 2, "RELEASED": 3, "CONSUMED": 5, "SUPERSEDED": 0},
                       window=300.0)
    assert m["engines"] == [{"engine_id": "d1", "retained_blocks": 10, "block_seconds": 1040.0},
                            {"engine_id": "d2", "retained_blocks": 0, "block_seconds": 0.0}]
    assert list(m["releases_by_reason"].items()) == [("CONSUMED", 5), ("EXPIRED", 2), ("RELEASED", 3)]
    assert len(render_memory(m)) == 2 and render_memory(None) == []
