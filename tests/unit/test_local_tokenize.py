"""In-process tokenization: file loading, the renderer's limits, the gateway's fallback, and the
simulator's `/tokenize` agreeing with a gateway that loads the simulator's files.

Agreement with vLLM itself is tests/vllm/test_local_tokenize.py (it needs vLLM's virtualenv).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from boomerang_gateway import chatrender, local_tokenize
from boomerang_gateway.local_tokenize import InProcessTokenizers
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import Kind, parse
from boomerang_gateway.settings import GatewaySettings
from boomerang_tools.sim import hfmodel
from boomerang_tools.sim.protocol import ProtocolError, chat_prompt_ids

from tests.support import chat_models


def _sim_conversations() -> list[dict[str, Any]]:
    convs = [body for _, body in chat_models.CONVERSATIONS.values()
             if not body.get("continue_final_message") and not body.get("add_special_tokens")]
    rng = random.Random(7)
    words = ["cache", " block", "\n", "<think>", "</think>", " ünï", "42", ", ", "\n\n", "{\"a\": 1}"]
    for _ in range(30):
        msgs: list[dict[str, Any]] = [{"role": rng.choice(["system", "developer"]), "content": "Be brief."}]
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["user", "assistant", "tool"])
            text = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            msg: dict[str, Any] = {"role": role, "content": text if rng.random() < 0.8 else [
                {"type": "text", "text": text}, {"type": "text", "text": "more"}]}
            if role == "assistant" and rng.random() < 0.3:
                msg["tool_calls"] = [chat_models.CALL]
            if role == "assistant" and rng.random() < 0.3:
                msg["reasoning"] = "hmm\n"
            msgs.append(msg)
        convs.append({"messages": msgs, **({"tools": [chat_models.WEATHER_TOOL]} if rng.random() < 0.4 else {})})
    return convs


@pytest.mark.parametrize("thinking", [False, True])
def test_the_simulator_and_a_gateway_on_its_files_agree(thinking: bool) -> None:
    local = local_tokenize.load(str(hfmodel.folder(thinking)))
    for body in _sim_conversations():
        assert local.chat_ids(body) == chat_prompt_ids(body, strip_reasoning=thinking), body


def test_the_simulator_refuses_what_its_template_refuses() -> None:
    body = {"messages": [{"role": "robot", "content": "x"}]}
    with pytest.raises(ProtocolError):
        chat_prompt_ids(body, False)
    with pytest.raises(chatrender.Unsupported):
        local_tokenize.load(str(hfmodel.folder(False))).chat_ids(body)


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
    {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"},
    {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tokenize": True}},
    {"messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=1\nhi"}]},
])
def test_what_is_not_mirrored_goes_to_the_engine(tmp_path: Path, body: dict[str, Any]) -> None:
    tok = local_tokenize.load(str(chat_models.write_model(tmp_path, "llama3")))
    with pytest.raises(chatrender.Unsupported):
        tok.chat_ids(body)


def test_content_format_detection_follows_vllm() -> None:
    assert chatrender.template_info(chat_models.GEMMA3)[0] is True
    for source in (chat_models.LLAMA3, chat_models.QWEN3, chat_models.MISTRAL, hfmodel.TEMPLATES["thinking"]):
        assert chatrender.template_info(source)[0] is False


def test_files_load_from_the_hugging_face_cache_layout(tmp_path: Path) -> None:
    repo = tmp_path / "models--acme--tiny"
    chat_models.write_model(repo / "snapshots" / "abc123", "qwen3")
    (repo / "snapshots" / "old").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    tok = local_tokenize.load("acme/tiny", tmp_path)
    assert tok.folder == repo / "snapshots" / "abc123"
    assert tok.chat_ids({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(local_tokenize.TokenizerFilesError, match="hf download acme/other"):
        local_tokenize.load("acme/other", tmp_path)
    with pytest.raises(local_tokenize.TokenizerFilesError, match="neither a folder"):
        local_tokenize.load("./nowhere", tmp_path)


def test_chat_template_jinja_file_wins_over_the_config(tmp_path: Path) -> None:
    folder = chat_models.write_model(tmp_path, "qwen3")
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    tok = local_tokenize.load(str(folder))
    assert tok.chat_ids({"messages": [{"role": "user", "content": "hi"}]}) == tok.encode("hi!", False)


def test_the_setting_names_models_and_locations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOMERANG_TOKENIZERS", "sim=/opt/sim , Qwen/Qwen3-32B")
    assert GatewaySettings().tokenizers == {"sim": "/opt/sim", "Qwen/Qwen3-32B": "Qwen/Qwen3-32B"}


def _request(text: str) -> Any:
    return parse(Kind.CHAT, json.dumps({"model": "sim", "messages": [{"role": "user", "content": text}]}).encode(), None)


async def test_one_mismatch_sends_the_model_back_to_tokenize() -> None:
    metrics = GatewayMetrics()
    local = InProcessTokenizers({"sim": str(hfmodel.folder(False)), "gone": "/nowhere/at/all"}, "", metrics)
    await local.load_all()
    assert not local.serves("gone") and local.serves("sim")
    ids = await local.ids(_request("Hello"))
    assert ids is not None
    local.verify("sim", ids, ids)
    assert local.serves("sim")
    local.verify("sim", ids, ids[:-1] + [0])
    assert not local.serves("sim")
    assert metrics.local_tokenize_mismatches.labels("sim")._value.get() == 1
    assert metrics.local_tokenize.labels("local")._value.get() == 1
    assert metrics.local_tokenize.labels("load_failed")._value.get() == 1
