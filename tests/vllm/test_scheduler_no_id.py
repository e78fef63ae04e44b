"""The hook in vLLM 0.33.0's own scheduler behind a proxy that names no conversation (issue 23).

As vLLM's example P/D proxy runs a turn: P gets the NixlConnector's first-turn params and
nothing else (no `boomerang` key, no extra args), D gets P's returned params; the body's
`cache_salt` reaches both engines as `Request.cache_salt`. P's hook plans each turn by its
token ids and salt, D's registers it with where its prompt ended: turn 2 pulls turn 1, and
an identical turn 2 under another salt (or none) does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import ServiceProcess, wait_for
from tests.vllm.engine import Finished
from tests.vllm.test_scheduler_hook import Pair, final_match, in_pool, whole_blocks

pytestmark = pytest.mark.vllm


def first_turn_no_id() -> dict[str, Any]:
    """What vLLM's example proxy sends P: the NixlConnector's first-turn params, nothing more."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}


@pytest.fixture
def pair(model_dir: Path, registry: ServiceProcess, router: ServiceProcess, reaper: ServiceProcess,
         unique: str) -> Iterator[Pair]:
    made = Pair(model_dir, registry, router, f"noid-{unique}")
    assert wait_for(lambda: in_pool(router, made.d.engine_id, made.p.engine_id), 20), "engines never joined the pool"
    yield made
    made.shutdown()


def prefill(pair: Pair, rid: str, prompt: list[int], salt: str | None) -> Finished:
    pair.p.submit(rid, prompt, 1, first_turn_no_id(), cache_salt=salt)
    done = pair.p.run([rid])[rid]
    assert done.kv_transfer_params is not None and done.kv_transfer_params["do_remote_prefill"] is True
    assert not (done.kv_transfer_params.get("boomerang") or {}).get("conversation_id")  # none was named
    return done


def turn(pair: Pair, rid: str, prompt: list[int], salt: str | None = None) -> tuple[Finished, Finished]:
    """P then D with no conversation id; waits until D's hook has registered the turn."""
    registered = pair.d.hook.stats()["sender"]["registered"]
    p_done = prefill(pair, f"p-{rid}", prompt, salt)
    pair.d.submit(f"d-{rid}", prompt, 40, p_done.kv_transfer_params, cache_salt=salt)
    d_done = pair.d.run([f"d-{rid}"])[f"d-{rid}"]
    assert wait_for(lambda: pair.d.hook.stats()["sender"]["registered"] == registered + 1, 10), pair.d.hook.stats()
    return p_done, d_done


def test_turn_two_pulls_turn_one_with_no_id(pair: Pair, unique: str) -> None:
    history = list(range(1000, 1300))
    _, d1 = turn(pair, f"a1-{unique}", history)
    assert pair.p.hook.counters["plan_pull"] == 0
    history2 = history + d1.output_token_ids + list(range(5100, 5137))
    p2, _ = turn(pair, f"a2-{unique}", history2)
    expected = whole_blocks(d1.kv_transfer_params["remote_num_tokens"])
    call = final_match(pair.p, p2.request_id)
    assert call.result == (expected, True) and pair.p.hook.counters["plan_pull"] == 1, (call, pair.p.hook.stats())
    recv = pair.p.receives[p2.request_id]
    assert recv.remote.request_id == d1.request_id and recv.remote.engine_id == pair.d.engine_id
    assert p2.kv_transfer_params["remote_prefill_cached_tokens"] == expected
    assert pair.p.hook.load() == (0, 0) and pair.d.hook.load() == (0, 0)


def test_another_cache_salt_never_pulls_and_the_same_one_does(pair: Pair, unique: str) -> None:
    history = list(range(2000, 2300))
    _, d1 = turn(pair, f"s1-{unique}", history, salt="salt-a")
    history2 = history + d1.output_token_ids + list(range(6100, 6137))
    for rid, salt in ((f"s2b-{unique}", "salt-b"), (f"s2n-{unique}", None)):
        p_other = prefill(pair, rid, history2, salt)
        assert final_match(pair.p, p_other.request_id).result == (0, False), pair.p.hook.stats()
        assert p_other.request_id not in pair.p.receives
    assert pair.p.hook.counters["plan_pull"] == 0
    # The lease was left for its own salt, which pulls it.
    p_same = prefill(pair, f"s2a-{unique}", history2, "salt-a")
    call = final_match(pair.p, p_same.request_id)
    assert call.result == (whole_blocks(d1.kv_transfer_params["remote_num_tokens"]), True), call
    assert pair.p.receives[p_same.request_id].remote.request_id == d1.request_id
    assert pair.p.hook.counters["plan_pull"] == 1
