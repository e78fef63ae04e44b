"""The vLLM hook behind a stock proxy that names no conversation (issue 23).

Two hooked simulated engines driven as vLLM's example P/D proxy drives them: P gets the
request with `max_tokens` 1 and the first-turn `kv_transfer_params`, D gets the request with
the params P returned, and nothing anywhere names a conversation (no `boomerang` key, no
header, no gateway). P's hook plans each turn by its token ids; D's registers it with where
its prompt ended; later turns PULL their own previous turn, and a first turn that only
shares the system prompt does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.gateway_stack import MODEL
from tests.support.hook_stack import HookStack, running_hook_stack
from tests.support.procs import wait_for

pytestmark = pytest.mark.e2e
# vLLM's example proxy (toy_proxy_server.py) sends exactly this to P on every request.
FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
SYSTEM = "You are a careful agent; read before you write. " * 60


@pytest.fixture
def stack(database_url: str) -> Iterator[HookStack]:
    with running_hook_stack(database_url) as s:
        yield s


def proxy_chat(stack: HookStack, messages: list[dict[str, str]]) -> str:
    """One turn as the example proxy serves it: P for one token, then D with P's params."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 40}
    p = httpx.post(stack.url("prefill") + "/v1/chat/completions", timeout=30,
                   json={**body, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(FIRST_TURN)})
    assert p.status_code == 200, p.text
    params = p.json()["kv_transfer_params"]
    # P's hook may add its tenant for D (the proxy passes P's params on as they are), but no
    # conversation: nothing named one.
    assert not params.get("boomerang", {}).get("conversation_id"), params
    d = httpx.post(stack.url("decode") + "/v1/chat/completions", timeout=30, json={**body, "kv_transfer_params": params})
    assert d.status_code == 200, d.text
    return str(d.json()["choices"][0]["message"]["content"])


def pulls(stack: HookStack) -> int:
    return int(stack.stats("prefill")["hook"].get("plan_pull", 0))


def test_later_turns_pull_their_own_turn_with_no_id_anywhere(stack: HookStack) -> None:
    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(2)]
    registered = 0
    for step in range(3):
        for k, history in enumerate(histories):  # interleaved, on one shared system prompt
            history.append({"role": "user", "content": f"Conversation {k}, step {step}: open file {k * 7 + step}."})
            before = pulls(stack)
            history.append({"role": "assistant", "content": proxy_chat(stack, history)})
            assert pulls(stack) - before == (1 if step else 0), (k, step, stack.stats("prefill")["hook"])
            registered += 1
            # The next turn can only find what D's hook has registered.
            assert wait_for(lambda n=registered: stack.stats("decode")["hook"]["sender"]["registered"] >= n, 10)
    # A first turn sharing only the system prompt pulls nothing, and takes no lease.
    before = pulls(stack)
    proxy_chat(stack, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "A stranger asks."}])
    assert pulls(stack) == before
    p, d = stack.stats("prefill"), stack.stats("decode")
    assert p["pulls"] == 4 and p["corrupt_pulls"] == p["expired_or_freed_reads"] == d["corrupt_loads"] == 0, p
    assert p["hook"].get("hook_errors", 0) == 0 and d["hook"].get("hook_errors", 0) == 0
