"""The gateway's in-process tokenization agrees with vLLM's own, token for token.

Each conversation goes through vLLM 0.33.0's `/tokenize` path — `TokenizeChatRequest`
validation, `OnlineRenderer.preprocess_chat`, the HF renderer, transformers'
`apply_chat_template` and the tokenizer `AutoTokenizer` loads from the folder — and through
`boomerang_gateway.local_tokenize` with the same files. Templates: Llama 3.1 (tools), Qwen3 (tool
calls, reasoning stripped before the last user turn), Mistral (system prompt), Gemma 3
(content parts), and the simulator's own Qwen-style files.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from boomerang_gateway import local_tokenize
from boomerang_tools.sim import hfmodel
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest, TokenizeCompletionRequest
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.renderers.registry import renderer_from_config

from tests.support import chat_models
from tests.vllm.engine import TINY_LLAMA

CASES = [(t, c) for c, (templates, _) in chat_models.CONVERSATIONS.items() for t in templates]


def _online(folder: Path) -> OnlineRenderer:
    config = EngineArgs(model=str(folder), max_model_len=16384, enforce_eager=True, dtype="float32").create_engine_config()
    return OnlineRenderer(config.model_config, renderer_from_config(config), request_logger=None, chat_template=None,
                          chat_template_content_format="auto")


def _vllm_chat_ids(online: OnlineRenderer, body: dict[str, Any]) -> list[int]:
    request = TokenizeChatRequest.model_validate({"model": "m", **body})
    tools = None if request.tools is None else [t.model_dump() for t in request.tools]

    async def run() -> list[int]:
        _, inputs = await online.preprocess_chat(request, request.messages, default_template=None,
                                                 default_template_content_format="auto", default_template_kwargs=None,
                                                 tool_dicts=tools, skip_mm_cache=True)
        return list(inputs[0]["prompt_token_ids"])  # type: ignore[typeddict-item]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[OnlineRenderer, local_tokenize.LocalTokenizer]]:
    out = {}
    for name in chat_models.TEMPLATES:
        folder = chat_models.write_model(tmp_path_factory.mktemp(name), name, TINY_LLAMA)
        out[name] = (_online(folder), local_tokenize.load(str(folder)))
    for thinking in (False, True):
        folder = tmp_path_factory.mktemp("sim")
        for f in hfmodel.folder(thinking).iterdir():
            shutil.copy(f, folder / f.name)
        chat_models.write_config(folder, {**TINY_LLAMA, "vocab_size": 151936})
        out[f"sim-{thinking}"] = (_online(folder), local_tokenize.load(str(folder)))
    return out


@pytest.mark.parametrize("template,conversation", CASES)
def test_chat_prompts_agree_token_for_token(models: dict[str, Any], template: str, conversation: str) -> None:
    online, local = models[template]
    body = chat_models.CONVERSATIONS[conversation][1]
    expected = _vllm_chat_ids(online, body)
    assert local.chat_ids(body) == expected


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("conversation", ["plain", "system", "multipart", "tools", "reasoning", "continue"])
def test_the_simulator_files_agree_with_vllm(models: dict[str, Any], thinking: bool, conversation: str) -> None:
    online, local = models[f"sim-{thinking}"]
    body = chat_models.CONVERSATIONS[conversation][1]
    assert local.chat_ids(body) == _vllm_chat_ids(online, body)


@pytest.mark.parametrize("template", list(chat_models.TEMPLATES))
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_completion_prompts_agree(models: dict[str, Any], template: str, add_special_tokens: bool) -> None:
    online, local = models[template]
    prompt = "The weather in Paris <|im_end|> is sunny, 24 degrees."
    request = TokenizeCompletionRequest.model_validate({"model": "m", "prompt": prompt,
                                                         "add_special_tokens": add_special_tokens})

    async def run() -> list[int]:
        inputs = await online.preprocess_completion(request, prompt_input=request.prompt, prompt_embeds=None,
                                                    skip_mm_cache=True)
        return list(inputs[0]["prompt_token_ids"])  # type: ignore[typeddict-item]

    assert local.encode(prompt, add_special_tokens) == asyncio.run(run())
