"""`boomerang replay` reads JSONL chat requests and ShareGPT JSON, and buckets TTFT by context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from boomerang_tools.demo.client import TurnResult
from boomerang_tools.replay.cli import Sample, bucket_of, summarize
from boomerang_tools.replay.loader import ReplayFormatError, load


def test_jsonl_groups_turns_by_conversation_in_order(tmp_path: Path) -> None:
    lines = [
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "conversation_id": "c1", "stream": True},
        {"conversation_id": "c2", "request": {"messages": [{"role": "user", "content": "b"}]}},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
         "metadata": {"conversation_id": "c1"}, "kv_transfer_params": {"remote_host": "evil"}},
        {"messages": [{"role": "user", "content": "z"}], "headers": {"X-Conversation-Id": "c3"}},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    convs = load(path)
    assert [c.conversation_id for c in convs] == ["c1", "c2", "c3"]
    assert len(convs[0].turns) == 2 and convs[0].turns[1].body is not None
    body = convs[0].turns[1].body
    assert "kv_transfer_params" not in body and "metadata" not in body and "stream" not in convs[0].turns[0].body  # type: ignore[operator]


def test_sharegpt_turns_are_human_messages(tmp_path: Path) -> None:
    data = [{"id": "s1", "conversations": [
        {"from": "system", "value": "sys"}, {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
        {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
        {"id": "empty", "conversations": [{"from": "gpt", "value": "only a reply"}]}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data, indent=2))
    convs = load(path)
    assert [c.conversation_id for c in convs] == ["s1"]
    assert convs[0].system == [{"role": "system", "content": "sys"}]
    assert [t.user for t in convs[0].turns] == [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]


@pytest.mark.parametrize("text", ['{"messages": []}', "not json", '{"model": "m", "messages": [{"role": "user"}]}',
                                  '[{"conversations": [{"from": "alien", "value": "x"}]}]'])
def test_bad_files_name_the_problem(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ReplayFormatError):
        load(path)


def test_buckets_and_summary() -> None:
    edges = (2000, 4000, 8000)
    assert [bucket_of(n, edges) for n in (10, 1999, 2000, 7999, 8000)] == ["0k–2k", "0k–2k", "2k–4k", "4k–8k", "≥8k"]
    samples = [Sample(mode, "c", i, TurnResult(ok=True, ttft_ms=ttft, prompt_tokens=tokens, plan=plan))
               for i, (mode, ttft, tokens, plan) in enumerate([
                   ("off", 100, 1000, "COLD"), ("off", 300, 3000, "COLD"), ("off", 500, 3500, "COLD"),
                   ("on", 90, 1000, "COLD"), ("on", 150, 3000, "PULL"), ("on", 250, 3500, "PULL")])]
    samples.append(Sample("on", "c", 9, TurnResult(ok=False, error="boom")))
    rows = summarize(samples, edges)
    assert [r["bucket"] for r in rows] == ["0k–2k", "2k–4k"]
    two = rows[1]
    assert two["off"]["ttft_p50_ms"] == 400 and two["on"]["ttft_p50_ms"] == 200 and two["speedup"] == 2.0
    assert two["on"]["plans"] == {"PULL": 2} and two["off"]["turns"] == 2
