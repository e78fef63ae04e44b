"""The gateway end to end with a stock OpenAI client: registry, router, simulated engines and
gateway as real processes over HTTP and gRPC, on the real Postgres.

What it must show (issue 9): turns 2+ of a conversation PULL with zero corrupt pulls; an
edited history or stripped reasoning reuses only a shorter verified prefix (or recomputes),
still with zero corrupt pulls and the same reply as a full recompute; streaming and not;
100 concurrent conversations; another tenant with the same conversation id gets no reuse.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway_stack import BOOMERANG, MODEL, THINKING, GatewayStack, running_stack

pytestmark = pytest.mark.e2e
SYSTEM = "You are a careful coding agent. " + "Read the code before you change it and run the tests. " * 30


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with running_stack() as s:
        yield s


@pytest.fixture(scope="module")
def key(stack: GatewayStack) -> str:
    return stack.new_key("e2e")


async def chat(c: openai.AsyncOpenAI, messages: list[dict[str, Any]], conv: str, model: str = MODEL,
               **extra: Any) -> tuple[str, dict[str, str]]:
    """One non-streaming turn: the reply and the Boomerang headers."""
    body = {**extra.pop("extra_body", {}), **({"conversation_id": conv} if conv else {})}
    raw = await c.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=24, extra_body=body or None, **extra)
    reply = raw.parse().choices[0].message.content or ""
    return reply, {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-boomerang")}


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"Step {i}: open file number {i} and " + "check the block cache. " * (10 + 5 * i)}


async def test_turns_two_and_later_pull_with_no_corrupt_pulls(stack: GatewayStack, key: str) -> None:
    before = stack.stats()
    conv = f"conv-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    reused = []
    async with stack.openai_client(key) as c:
        for i in range(5):
            messages.append(user(i))
            reply, headers = await chat(c, messages, conv)
            assert reply
            messages.append({"role": "assistant", "content": reply})
            assert headers["x-boomerang-plan"] == ("COLD" if i == 0 else "PULL"), (i, headers)
            reused.append(int(headers["x-boomerang-reused-tokens"]))
    assert reused[0] == 0 and all(b > a > 0 for a, b in itertools.pairwise(reused[1:]))
    after = stack.stats()
    assert after["pulls"] - before["pulls"] == 4
    assert after["pulled_tokens"] - before["pulled_tokens"] == sum(reused)
    assert stack.unsafe() == 0


async def test_streaming_and_non_streaming_give_the_same_turns(stack: GatewayStack, key: str) -> None:
    async with stack.openai_client(key) as c:
        await _streaming_and_not(stack, c)
    assert stack.unsafe() == 0


async def _streaming_and_not(stack: GatewayStack, c: openai.AsyncOpenAI) -> None:
    plain: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    streamed: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    conv_a, conv_b = f"ns-{uuid.uuid4().hex}", f"s-{uuid.uuid4().hex}"
    for i in range(3):
        plain.append(user(i))
        streamed.append(user(i))
        reply, headers = await chat(c, plain, conv_a)
        async with c.chat.completions.with_streaming_response.create(
            model=MODEL, messages=streamed, max_tokens=24, stream=True,
            stream_options={"include_usage": True}, extra_headers={"X-Conversation-Id": conv_b},
        ) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-boomerang-plan"] == headers["x-boomerang-plan"]
            pieces, usage, raw_chunks = [], None, []
            async for chunk in await resp.parse():
                raw_chunks.append(chunk.model_dump_json())
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
        assert "".join(pieces) == reply and len(pieces) > 1
        assert usage is not None and usage.completion_tokens == len(pieces)
        assert not any("kv_transfer_params" in r or "token_ids" in r for r in raw_chunks)
        plain.append({"role": "assistant", "content": reply})
        streamed.append({"role": "assistant", "content": reply})


async def test_completions_endpoint_streams_and_pulls(stack: GatewayStack, key: str) -> None:
    conv = f"cmpl-{uuid.uuid4().hex}"
    prompt = SYSTEM + "\n"
    async with stack.openai_client(key) as c:
        for i in range(3):
            raw = await c.completions.with_raw_response.create(
                model=MODEL, prompt=prompt, max_tokens=12, extra_headers={"X-Conversation-Id": conv})
            text = raw.parse().choices[0].text
            assert raw.headers["x-boomerang-plan"] == ("COLD" if i == 0 else "PULL")
            stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True)
            assert "".join([ch.choices[0].text async for ch in stream if ch.choices]) == text
            prompt += text + f"\nNext step {i}: " + "read more code. " * 8 + "\n"
    assert stack.unsafe() == 0


async def _off(stack: GatewayStack, key: str, messages: list[dict[str, Any]], model: str) -> str:
    """The reply a full recompute gives (Boomerang off): what a correct pull must also give."""
    async with stack.openai_client(key) as c:
        reply, headers = await chat(c, messages, "", model=model, extra_headers={"X-Boomerang-Reuse": "off"})
    assert headers["x-boomerang-plan"] == "COLD"
    return reply


async def test_edited_history_reuses_only_the_verified_prefix(stack: GatewayStack, key: str) -> None:
    async with stack.openai_client(key) as c:
        await _edited_history(stack, key, c)


async def _edited_history(stack: GatewayStack, key: str, c: openai.AsyncOpenAI) -> None:
    conv = f"edit-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(3):
        messages.append(user(i))
        reply, _ = await chat(c, messages, conv)
        messages.append({"role": "assistant", "content": reply})
    held = (await c.chat.completions.create(model=MODEL, messages=messages[:-1], max_tokens=1,
                                            extra_headers={"X-Boomerang-Reuse": "off"})).usage
    assert held is not None
    edited = [dict(m) for m in messages] + [user(3)]
    edited[1]["content"] = "Actually, start from file number 9. " + edited[1]["content"]  # the first user turn
    expected = await _off(stack, key, edited, MODEL)
    before = stack.stats()
    reply, headers = await chat(c, edited, conv)
    assert reply == expected  # a wrong pull would change the reply
    reused = int(headers["x-boomerang-reused-tokens"])
    if headers["x-boomerang-plan"] == "PULL":
        assert 0 < reused < held.prompt_tokens, headers  # only the system prompt's blocks still match
    else:
        assert headers["x-boomerang-plan"] == "RECOMPUTE" and reused == 0, headers
    assert stack.stats()["pulled_tokens"] - before["pulled_tokens"] == reused
    assert stack.unsafe() == 0


async def test_stripped_reasoning_reuses_only_the_verified_prefix(stack: GatewayStack, key: str) -> None:
    async with stack.openai_client(key) as c:
        await _stripped_reasoning(stack, key, c)


async def _stripped_reasoning(stack: GatewayStack, key: str, c: openai.AsyncOpenAI) -> None:
    conv = f"think-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, user(0)]
    first = await c.chat.completions.with_raw_response.create(
        model=THINKING, messages=messages, max_tokens=64, extra_headers={"X-Conversation-Id": conv})
    done = first.parse()
    reply = done.choices[0].message.content or ""
    assert "</think>" in reply  # the thinking model's reply; its template strips it next turn
    assert done.usage is not None
    messages += [{"role": "assistant", "content": reply}, user(1)]
    expected = await _off(stack, key, messages, THINKING)
    reply2, headers = await chat(c, messages, conv, model=THINKING)
    assert reply2 == expected
    reused = int(headers["x-boomerang-reused-tokens"])
    # D holds prompt + reasoning + answer; the new prompt matches only the old prompt.
    assert reused <= done.usage.prompt_tokens, headers
    assert headers["x-boomerang-plan"] in ("PULL", "RECOMPUTE")
    assert stack.unsafe() == 0


async def test_another_tenant_with_the_same_conversation_id_gets_no_reuse(stack: GatewayStack, key: str) -> None:
    other = stack.new_key("other")
    conv = f"shared-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, user(0)]
    async with stack.openai_client(key) as mine_c, stack.openai_client(other) as theirs_c:
        reply, _ = await chat(mine_c, messages, conv)
        messages += [{"role": "assistant", "content": reply}, user(1)]
        _, theirs = await chat(theirs_c, messages, conv)
        # Ruled out by the live-lease summary (its keys are per tenant), or by the router's plan.
        assert theirs["x-boomerang-plan"] == "COLD" and theirs["x-boomerang-reason"] in ("NO_LIVE_LEASE", "NO_LEASE"), theirs
        _, mine = await chat(mine_c, messages, conv)
    assert mine["x-boomerang-plan"] == "PULL"  # the other tenant neither used nor spoiled it
    assert stack.unsafe() == 0


async def test_client_kv_transfer_params_never_reach_an_engine(stack: GatewayStack, key: str) -> None:
    before = stack.stats()
    evil = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": "x", "remote_request_id": "y",
            "remote_block_ids": [[0, 1, 2]], "remote_host": "127.0.0.1", "remote_port": 9, "remote_num_tokens": 48}
    async with stack.openai_client(key) as c:
        reply, headers = await chat(c, [user(0)], "", extra_body={"kv_transfer_params": evil})
    assert reply and headers["x-boomerang-plan"] == "COLD"
    after = stack.stats()
    assert after["pull_failures"] == before["pull_failures"] and after["pulls"] == before["pulls"]
    metrics = httpx.get(stack.gateway_url + "/metrics").text
    assert "boomerang_gateway_client_kv_transfer_params_dropped_total 1.0" in metrics


async def test_errors_are_openai_shaped_with_the_right_status(stack: GatewayStack, key: str) -> None:
    url = stack.gateway_url
    good = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=30) as http:
        cases = [
            (await http.post(url + "/v1/chat/completions", json=body), 401),
            (await http.post(url + "/v1/chat/completions", json=body,
                             headers={"Authorization": "Bearer bmr_000000000000_" + "A" * 43}), 401),
            (await http.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer EMPTY"}), 401),
            (await http.post(url + "/v1/chat/completions", content=b"{oops", headers=good), 400),
            (await http.post(url + "/v1/chat/completions", json={**body, "n": 3}, headers=good), 400),
            (await http.post(url + "/v1/chat/completions", json={**body, "model": "nope"}, headers=good), 404),
            (await http.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"}, headers=good), 404),
            (await http.post(url + "/v1/chat/completions", content=b"x" * (9 * 1024 * 1024),
                             headers={**good, "content-type": "application/json"}), 413),
            (await http.post(url + "/v1/chat/completions", json={**body, "max_tokens": 10_000_000}, headers=good), 400),
            (await http.get(url + "/v1/nothing", headers=good), 404),
            (await http.get(url + "/v1/chat/completions", headers=good), 405),
            (await http.get(url + "/v1/models"), 401),
        ]
        for resp, status in cases:
            assert resp.status_code == status, (resp.request.url, resp.text)
            err = resp.json()["error"]
            assert err["message"] and err["type"], err
        engine_error = cases[8][0].json()["error"]
        assert "max_tokens" in engine_error["message"]  # the engine's own words, passed through
        models = (await http.get(url + "/v1/models", headers=good)).json()
        assert {m["id"] for m in models["data"]} == {MODEL, THINKING}  # its own database: only its engines
        assert (await http.get(url + "/health")).json()["status"] == "ok"
        metrics = (await http.get(url + "/metrics")).text
        assert 'boomerang_gateway_turns_total{decision="PULL",reason="VERIFIED_PREFIX"}' in metrics
        assert 'boomerang_gateway_requests_total{endpoint="chat",status="401"}' in metrics


async def test_hundred_concurrent_conversations(stack: GatewayStack, key: str) -> None:
    c = stack.openai_client(key, http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=200), timeout=120))
    plans: list[str] = []

    async def conversation(n: int) -> None:
        conv = f"many-{n}-{uuid.uuid4().hex[:6]}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"Agent {n}. " + SYSTEM[:400]}]
        for i in range(3):
            messages.append(user(i))
            reply, headers = await chat(c, messages, conv, stream=False)
            messages.append({"role": "assistant", "content": reply})
            if i:
                plans.append(headers["x-boomerang-plan"])

    before = stack.stats()
    async with c:
        await asyncio.gather(*(conversation(n) for n in range(100)))
    assert len(plans) == 200 and plans.count("PULL") == 200, {p: plans.count(p) for p in set(plans)}
    assert stack.stats()["pulls"] - before["pulls"] == 200
    assert stack.unsafe() == 0


def test_replay_both_modes_against_the_gateway(stack: GatewayStack, key: str, tmp_path: Path) -> None:
    convs = [{"id": f"r{i}", "conversations": [
        {"from": "system", "value": SYSTEM},
        *[m for t in range(3) for m in ({"from": "human", "value": user(t)["content"]}, {"from": "gpt", "value": "ok"})],
    ]} for i in range(2)]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    out = tmp_path / "replay.json"
    run = subprocess.run([BOOMERANG, "replay", str(data), "--url", stack.gateway_url, "--api-key", key,
                          "--max-tokens", "16", "--concurrency", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    written = json.loads(out.read_text())
    assert all("speedup" in b for b in written["buckets"])
    turns = written["turns"]
    assert len(turns) == 12 and all(t["ok"] and t["ttft_ms"] > 0 for t in turns)
    assert {t["plan"] for t in turns if t["mode"] == "off"} == {"COLD"}
    assert [t["plan"] for t in turns if t["mode"] == "on" and t["turn"] > 0] == ["PULL"] * 4


def _gateway_metric(stack: GatewayStack, line_start: str) -> float:
    text = httpx.get(stack.gateway_url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


async def test_a_first_turn_the_lease_summary_rules_out_starts_cold_and_its_next_turn_pulls(
    stack: GatewayStack, key: str
) -> None:
    """A new conversation has no live lease: the gateway starts it at once (no tokenize, no plan
    before its prefill), yet its report registers the lease (the plan made beside it gives the
    id), so the next turn, sent at once, pulls."""
    async with stack.openai_client(key) as c:
        headers: dict[str, str] = {}
        for _ in range(100):  # until the gateway's summary has its first snapshot
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, user(0)]
            reply, headers = await chat(c, messages, f"conv-{uuid.uuid4().hex}")
            if headers["x-boomerang-reason"] == "NO_LIVE_LEASE":
                break
            await asyncio.sleep(0.1)
        assert headers["x-boomerang-plan"] == "COLD" and headers["x-boomerang-reason"] == "NO_LIVE_LEASE", headers
        conv = f"conv-{uuid.uuid4().hex}"
        messages = [{"role": "system", "content": SYSTEM}, user(0)]
        reply, headers = await chat(c, messages, conv)
        assert headers["x-boomerang-reason"] == "NO_LIVE_LEASE" and "x-boomerang-plan-id" not in headers
        messages += [{"role": "assistant", "content": reply}, user(1)]
        _, headers = await chat(c, messages, conv)
        assert headers["x-boomerang-plan"] == "PULL", headers
    assert _gateway_metric(stack, 'boomerang_gateway_lease_summary_total{verdict="ruled_out"}') >= 2
    assert _gateway_metric(stack, "boomerang_gateway_lease_summary_false_no_total") == 0
    assert stack.unsafe() == 0


async def test_a_first_turn_without_an_id_starts_cold_and_its_next_turn_pulls(
    stack: GatewayStack, key: str
) -> None:
    """A chat without a conversation id and without an assistant message continues no lease
    (a continuation holds the output of the turn it continues): the gateway starts it at once,
    no tokenize and no plan before its prefill, and its next turn (no id either) still pulls.
    Sent again as it was (a regeneration), it starts at once too, and the plans made beside
    them find no "no" that was wrong."""
    first_turns = _gateway_metric(stack, 'boomerang_gateway_lease_summary_total{verdict="first_turn"}')
    false_no = _gateway_metric(stack, "boomerang_gateway_lease_summary_false_no_total")
    async with stack.openai_client(key) as c:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, user(7)]
        reply, headers = await chat(c, messages, "")
        assert headers["x-boomerang-reason"] == "NO_LIVE_LEASE" and "x-boomerang-plan-id" not in headers, headers
        _, headers = await chat(c, messages, "")
        assert headers["x-boomerang-reason"] == "NO_LIVE_LEASE", headers
        _, headers = await chat(c, [*messages, {"role": "assistant", "content": reply}, user(8)], "")
        assert headers["x-boomerang-plan"] == "PULL", headers
    assert _gateway_metric(stack, 'boomerang_gateway_lease_summary_total{verdict="first_turn"}') - first_turns == 2
    assert _gateway_metric(stack, "boomerang_gateway_lease_summary_false_no_total") == false_no
    assert stack.unsafe() == 0
