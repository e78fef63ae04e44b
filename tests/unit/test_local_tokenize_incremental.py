"""Incremental tokenization equals a full tokenization: a conversation's next prompt, tokenized
from the last special token it shares with the previous one, gives the very ids of the whole
prompt tokenized again (on the simulator's tokenizer and on byte-level BPEs with the chat
templates of Llama 3, Qwen 3, Mistral and Gemma 3), however the history changed."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from boomerang_gateway import local_tokenize
from boomerang_gateway.local_tokenize import InProcessTokenizers, history_key
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import Kind, parse
from boomerang_tools.sim import hfmodel

from tests.support import chat_models
from tests.unit.test_local_tokenize import _sim_conversations


def _grown(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's conversation as its client sent it: one request per prefix of its messages."""
    messages = body["messages"]
    return [{**body, "messages": messages[:n]} for n in range(1, len(messages) + 1)]


def _edited(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The same request with one earlier message changed (an edited or truncated history)."""
    messages = [dict(m) for m in body["messages"]]
    victim = messages[rng.randrange(len(messages))]
    victim["content"] = "edited: " + str(victim.get("content") or "")
    return {**body, "messages": messages}


class _Counting:
    """The tokenizer, counting the characters `chat_encoding` had it tokenize."""

    def __init__(self, inner: Any):
        self.inner, self.chars = inner, 0

    def encode(self, text: str, add_special_tokens: bool) -> Any:
        self.chars += len(text)
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def get_added_tokens_decoder(self) -> Any:
        return self.inner.get_added_tokens_decoder()


def _check(tok: local_tokenize.LocalTokenizer, bodies: list[dict[str, Any]]) -> tuple[int, int]:
    """Each body's incremental ids equal its full ids; (characters tokenized, characters sent)."""
    full = local_tokenize.LocalTokenizer(tok.folder, tok.tokenizer, tok.templates, tok.special_tokens)
    counting = _Counting(tok.tokenizer)
    tok.tokenizer = counting  # type: ignore[assignment]
    previous: local_tokenize.Encoded | None = None
    sent = 0
    for body in bodies:
        encoded = tok.chat_encoding(body, previous)
        assert encoded is not None
        assert list(encoded.ids) == full.chat_ids(body), body
        sent += len(encoded.text)
        previous = encoded
    tok.tokenizer = counting.inner
    return counting.chars, sent


@pytest.mark.parametrize("thinking", [False, True])
def test_the_simulators_tokenizer_grown_and_edited(thinking: bool) -> None:
    tok = local_tokenize.load(str(hfmodel.folder(thinking)))
    rng = random.Random(11)
    tokenized = sent = 0
    for body in _sim_conversations():
        bodies = _grown(body)
        bodies += [_edited(bodies[-1], rng), bodies[-1]]
        done, total = _check(tok, bodies)
        tokenized, sent = tokenized + done, sent + total
    assert tokenized < sent * 0.6  # the history was not tokenized again


@pytest.mark.parametrize("name", sorted(chat_models.TEMPLATES))
def test_byte_level_bpe_with_real_templates(tmp_path: Path, name: str) -> None:
    tok = local_tokenize.load(str(chat_models.write_model(tmp_path / name, name)))
    rng = random.Random(5)
    for templates, body in chat_models.CONVERSATIONS.values():
        if name not in templates or body.get("add_special_tokens") or body.get("continue_final_message"):
            continue
        bodies = _grown(body)
        _check(tok, [*bodies, _edited(bodies[-1], rng), bodies[0]])


def test_a_request_adding_special_tokens_is_tokenized_whole(tmp_path: Path) -> None:
    tok = local_tokenize.load(str(chat_models.write_model(tmp_path / "llama3", "llama3")))
    assert tok.chat_encoding({"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True}, None) is None


async def test_the_gateway_keeps_each_conversations_last_prompt() -> None:
    local = InProcessTokenizers({"sim": str(hfmodel.folder(False))}, "", GatewayMetrics())
    await local.load_all()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    tok = local_tokenize.load(str(hfmodel.folder(False)))
    for turn in range(4):
        messages += [{"role": "user", "content": f"step {turn}: " + "read the cache. " * 50}]
        body = {"model": "sim", "messages": messages, "conversation_id": "c-1"}
        req = parse(Kind.CHAT, json.dumps(body).encode(), None)
        assert await local.ids(req) == tok.chat_ids({"messages": messages})
        assert local._last[("sim", "id\x00c-1")].text.endswith("<|im_start|>assistant\n")
        messages += [{"role": "assistant", "content": f"done {turn}"}]


async def test_without_an_id_the_last_prompt_with_the_same_opening_is_kept() -> None:
    """A client that sends no conversation id is tokenized incrementally too: from the last
    prompt that opened with the same two messages (the ids still equal a full tokenization)."""
    local = InProcessTokenizers({"sim": str(hfmodel.folder(False))}, "", GatewayMetrics())
    await local.load_all()
    tok = local_tokenize.load(str(hfmodel.folder(False)))
    system = {"role": "system", "content": "Be brief. " * 200}
    keys = set()
    for first in ("plan the change", "fix the test"):
        messages: list[dict[str, Any]] = [system]
        for turn in range(3):
            messages += [{"role": "user", "content": f"{first}, step {turn}: " + "read the cache. " * 50}]
            req = parse(Kind.CHAT, json.dumps({"model": "sim", "messages": messages}).encode(), None)
            key = history_key(req)
            assert key is not None and (key in local._last) == (turn > 0)  # the last prompt to continue
            assert await local.ids(req) == tok.chat_ids({"messages": messages})
            assert local._last[key].text.endswith("<|im_start|>assistant\n") and len(local._last[key].ids) > 800
            keys.add(key)
            messages += [{"role": "assistant", "content": f"done {turn}"}]
    assert len(keys) == 2 and set(local._last) == keys  # one per opening


@pytest.mark.parametrize("thinking", [False, True])
def test_a_prompt_known_by_its_ids_is_kept_without_tokenizing(thinking: bool) -> None:
    """A turn not tokenized here (the lease summary started it at once) is kept from the
    engine's ids: the next prompt, tokenized from it, still equals a full tokenization."""
    tok = local_tokenize.load(str(hfmodel.folder(thinking)))
    for body in _sim_conversations():
        bodies = _grown(body)
        for first, second in itertools.pairwise(bodies):
            kept = tok.chat_encoding_of(first, tok.chat_ids(first))
            full = tok.chat_encoding(first, None)
            assert kept is not None and full is not None and kept.cuts == full.cuts
            encoded = tok.chat_encoding(second, kept)
            assert encoded is not None and list(encoded.ids) == tok.chat_ids(second)
    body = _sim_conversations()[0]
    ids = tok.chat_ids(body)
    wrong = [i for i in ids if i not in tok.added_ids]  # the special tokens gone: they cannot line up
    assert tok.chat_encoding_of(body, wrong) is None
