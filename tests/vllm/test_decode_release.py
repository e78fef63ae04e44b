"""Releasing D's memory through vLLM 0.33.0's own expiry path, inside its real scheduler.

A turn nobody will pull any more (here: superseded by the conversation's next turn) reaches
D's hook in its heartbeat's answer; at the next scheduler step the hook moves the request's
send deadline to now in the NixlConnector scheduler's `_reqs_need_send`. These tests check
every link of what vLLM then does with it: the connector metadata carries the deadline at
or before the scheduler clock; vLLM's own NIXL pull worker (its real `start_load_kv` and
`get_finished`, on an instance without NIXL: nothing here transfers) returns the request as
`finished_sending`; and the scheduler frees the blocks. A vLLM whose path drifts (renamed
maps, a worker that no longer overwrites a deadline, a reaper that moved) fails here.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from boomerang.v1 import types_pb2 as tpb
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

from tests.support.procs import ServiceProcess, wait_for
from tests.vllm.test_scheduler_hook import Pair, in_pool, leases, retained

pytestmark = pytest.mark.vllm


class _NoNixl:
    """The NIXL agent's one call the send side makes each step: no notifications here."""

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}


def vllm_pull_worker() -> Any:
    """vLLM's own `NixlPullConnectorWorker`, its send-side state set as its `__init__` sets it
    (that constructor registers GPU memory with NIXL, which a CPU machine cannot)."""
    w: Any = object.__new__(NixlPullConnectorWorker)
    w._reqs_to_send, w._reqs_to_process = {}, set()
    w._replicated_pcp_done_sending = set()
    w._ready_requests = queue.Queue()
    w._recving_metadata, w._recving_transfers = {}, defaultdict(list)
    w._failed_recv_reqs, w._recv_failures, w._pending_recv_notifs = queue.Queue(), set(), {}
    w.consumer_notification_counts_by_req = defaultdict(int)
    w.expected_consumer_notifications_by_req = {}
    w.xfer_stats = NixlKVConnectorStats()
    w.pcp_rank, w.pcp_dcp_sharded, w.tp_rank = 0, False, 0
    w.transfer_topo, w.nixl_wrapper = object(), _NoNixl()
    w.use_host_buffer, w._has_mamba = False, False
    w._handshake_lock, w._handshake_futures = threading.Lock(), {}
    w._remote_agents, w._engine_by_address = {}, {}
    w._failed_remote_engines, w._invalid_remote_engines = set(), set()
    return w


def attach_worker(pair: Pair) -> Any:
    """Run D's metadata through vLLM's worker every step. The NIXL receives (P → D) and D's
    heartbeats to P are what cannot run without NIXL; everything about sends does."""
    worker = vllm_pull_worker()

    def step(meta: Any) -> set[str]:
        sends = copy.copy(meta)
        sends.reqs_to_recv, sends.heartbeat_by_engine = {}, {}
        worker.start_load_kv(sends)
        finished_sending, _ = worker.get_finished()
        return set(finished_sending)

    pair.d.worker = step
    return worker


@pytest.fixture
def pair(model_dir: Path, registry: ServiceProcess, router: ServiceProcess, reaper: ServiceProcess,
         unique: str) -> Any:
    made = Pair(model_dir, registry, router, unique)
    assert wait_for(lambda: in_pool(router, made.d.engine_id, made.p.engine_id), 20), "engines never joined the pool"
    yield made
    made.shutdown()


def free_blocks(pair: Pair) -> int:
    return int(pair.d.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def test_superseded_turn_is_freed_by_vllm_on_its_next_step(pair: Pair, unique: str) -> None:
    worker = attach_worker(pair)
    conversation = f"c-{unique}"
    _, first = pair.turn(conversation, list(range(1000, 1400)))
    rid = first.request_id
    held = sum(len(g) for g in first.kv_transfer_params["remote_block_ids"])
    pair.d.step()  # the deadline vLLM set as the request finished reaches the worker
    assert held > 0 and rid in worker._reqs_to_send  # vLLM pins the turn until its TTL
    before = free_blocks(pair)
    # The next turn's history was rewritten from the start: P cannot pull, D registers the new
    # turn, and the registry supersedes the first one in the same statement.
    _, second = pair.turn(conversation, list(range(7000, 7300)))
    registered = time.monotonic()
    assert wait_for(lambda: pair.d.hook.releases.counters["releases_received"] >= 1, 5), pair.d.hook.stats()
    latency = time.monotonic() - registered
    states = {ls.remote_request_id: ls.state for ls in leases(pair.registry, pair.tenant, conversation)}
    assert states[rid] == tpb.LEASE_STATE_SUPERSEDED
    assert latency < 1.5, latency  # registration queue + one release heartbeat (0.5 s)
    freed_by_second = free_blocks(pair)
    pair.d.step()
    meta = pair.d.metas[-1]
    # The metadata vLLM hands its workers carries the deadline, at or before the scheduler clock.
    assert meta.reqs_to_send[rid] <= meta.scheduler_clock
    live = meta.reqs_to_send.get(second.request_id)  # it finished the step before: its TTL, untouched
    assert live is None or live > meta.scheduler_clock + 400
    # vLLM's worker reaped it in that same step; the scheduler freed its blocks.
    assert rid not in worker._reqs_to_send and rid not in worker._reqs_to_process
    assert rid not in pair.d.scheduler.requests
    assert free_blocks(pair) == freed_by_second + held
    # Only the live turn is pinned now.
    assert free_blocks(pair) == before + held - sum(len(g) for g in second.kv_transfer_params["remote_block_ids"])
    counters = pair.d.hook.stats()
    assert counters["releases_applied"] == 1 and counters["released_blocks"] == held
    # The heartbeat reports D's free blocks as vLLM counted them at that step's start.
    assert pair.d.hook.releases.memory() == (freed_by_second, pair.d.scheduler.kv_cache_manager.block_pool.num_gpu_blocks)


def test_a_release_for_a_turn_vllm_already_freed_never_reaches_vllm(pair: Pair, unique: str) -> None:
    worker = attach_worker(pair)
    _, done = pair.turn(f"c-{unique}", list(range(2000, 2300)))
    rid = done.request_id
    pair.d.step()
    # P read it: vLLM's worker reports it finished sending (the read notice), the hook forgets it.
    worker._reqs_to_send[rid] = 0.0
    pair.d.step()
    assert rid not in pair.d.scheduler.requests
    pair.d.hook.releases.receive([rid])  # a late release (consumed, say)
    pair.d.step()  # vLLM's scheduler asserts on a finished_sending for a request it freed
    assert rid not in pair.d.metas[-1].reqs_to_send
    assert pair.d.hook.releases.counters["releases_not_held"] == 1


def test_a_claimed_turn_is_not_released(pair: Pair, unique: str) -> None:
    attach_worker(pair)
    conversation = f"c-{unique}"
    history = list(range(3000, 3300))
    _, first = pair.turn(conversation, history)
    # D's sender registers turn 1 in the background: turn 2 may plan once the lease is there.
    assert wait_for(lambda: len(retained(pair.registry, pair.tenant, conversation)) == 1, 10)
    # Turn 2 pulls turn 1: the lease is claimed (then consumed) — never released under P.
    _, second = pair.turn(conversation, history + first.output_token_ids + list(range(9000, 9040)))
    assert pair.p.hook.counters["plan_pull"] == 1, pair.p.hook.stats()
    assert wait_for(lambda: any(ls.remote_request_id == first.request_id and ls.state == tpb.LEASE_STATE_CONSUMED
                                for ls in leases(pair.registry, pair.tenant, conversation)), 5)
    # No release was ever sent while claimed: the only one is the consumed lease's backstop.
    assert wait_for(lambda: pair.d.hook.releases.counters["releases_received"] >= 1, 5)
    assert pair.d.hook.releases.counters["releases_received"] == 1
    assert second.request_id in pair.d.hook.releases._pinned
