"""Simulated KV memory and kv_transfer_params classification."""

from __future__ import annotations

import time

import pytest
from boomerang_tools.sim.kvstore import Clock, HandleKind, KVStore, PoolExhausted, ReadError
from boomerang_tools.sim.nixl import Mode, ParamsError, classify, retained_params

FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


def store(blocks: int = 8) -> KVStore:
    return KVStore(num_blocks=blocks, block_size=4, clock=Clock(1000.0))


def test_a_handle_serves_exactly_one_read() -> None:
    kv = store()
    alloc = kv.allocate(10)
    h = kv.pin(HandleKind.RETAINED, "r1", alloc, list(range(10)), ttl=60, generation=3)
    assert h.block_ids == [0, 1, 2] and kv.used_blocks == 3
    assert kv.read("r1", h.block_ids[:2], 6, generation=3) == [0, 1, 2, 3, 4, 5]
    assert kv.used_blocks == 0
    with pytest.raises(ReadError) as err:
        kv.read("r1", h.block_ids[:2], 6, generation=3)
    assert err.value.reason == "FREED"


def test_reads_check_generation_and_block_ids() -> None:
    kv = store()
    h = kv.pin(HandleKind.RETAINED, "r1", kv.allocate(8), list(range(8)), ttl=60, generation=2)
    for ids, gen, reason in [(h.block_ids, 1, "STALE_GENERATION"), ([7], 2, "UNKNOWN_BLOCKS"), ([], None, "UNKNOWN_BLOCKS")]:
        with pytest.raises(ReadError) as err:
            kv.read("r1", ids, 8, gen)
        assert err.value.reason == reason
    assert kv.read("r1", h.block_ids, 8, None) == list(range(8))


def test_handles_expire_on_the_engine_clock() -> None:
    kv = store()
    h = kv.pin(HandleKind.RETAINED, "r1", kv.allocate(4), [1, 2, 3, 4], ttl=0.05, generation=1)
    assert h.expires_at == pytest.approx(time.perf_counter() + 1000.0 + 0.05, abs=0.01)
    assert kv.pinned_blocks(HandleKind.RETAINED) == 1
    time.sleep(0.08)
    assert kv.pinned_blocks(HandleKind.RETAINED) == 0 and kv.expired == 1
    with pytest.raises(ReadError):
        kv.read("r1", h.block_ids, 4, None)


def test_freed_block_ids_are_reused_fifo_and_the_pool_is_finite() -> None:
    kv = store(blocks=4)
    a = kv.allocate(8)
    kv.release(a)
    assert kv.allocate(8).block_ids == [2, 3]  # the free queue is FIFO, as in vLLM
    with pytest.raises(PoolExhausted):
        kv.allocate(16)


def test_pin_keeps_only_the_blocks_its_tokens_need() -> None:
    kv = store()
    alloc = kv.allocate(9)  # 3 blocks
    h = kv.pin(HandleKind.HELD, "p1", alloc, list(range(5)), ttl=60, generation=1)
    assert h.block_ids == [0, 1] and kv.used_blocks == 2
    assert kv.drop("p1") and not kv.drop("p1")


def test_classify_follows_the_connector() -> None:
    assert classify(None) == (Mode.PLAIN, None)
    assert classify(FIRST_TURN)[0] is Mode.PREFILL
    params = retained_params([1, 2], "d", "req", "127.0.0.1", 7000, 20, 123.0, 4)
    mode, handle = classify(params)
    assert mode is Mode.PULL and handle is not None
    assert (handle.block_ids, handle.num_tokens, handle.expiry_time, handle.generation) == ([1, 2], 20, 123.0, 4)
    missing_host = {**params, "remote_host": None}
    assert classify(missing_host)[0] is Mode.PREFILL  # not a pull unless every field is present
    assert classify({**params, "remote_block_ids": [3, 4]})[1].block_ids == [3, 4]  # type: ignore[union-attr]
    assert classify({"do_remote_prefill": True, "remote_block_ids": [[5]]})[0] is Mode.DECODE
    with pytest.raises(ParamsError):
        classify({**params, "remote_port": "7000"})


def test_retained_params_carry_every_field_of_the_contract() -> None:
    params = retained_params([1], "d", "req", "127.0.0.1", 7000, 20, 123.0, 4)
    assert set(params) == {
        "do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id", "remote_request_id",
        "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
        "remote_blocks_expiry_time", "remote_registration_generation", "transfer_mode",
    }
    assert params["remote_block_ids"] == [[1]] and params["transfer_mode"] == "pull"
