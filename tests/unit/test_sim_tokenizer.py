"""The simulator's tokenizer, chat template and output generator."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from boomerang_tools.sim import hfmodel, template
from boomerang_tools.sim.generate import PUNCT, WORDS, generate
from boomerang_tools.sim.tokenizer import (
    IM_END,
    SKIPPED_IN_TEXT,
    SPECIAL_TOKENS,
    TOKENIZER,
    encode,
    piece_id,
)

EOS = "<|im_end|>"


def _reply(prompt_ids: list[int], reasoning: bool = False, limit: int = 200) -> tuple[list[int], str]:
    ids, pieces = [], []
    for piece in generate(prompt_ids, EOS, reasoning):
        ids.append(piece.id)
        pieces.append(piece.text)
        if piece.text == EOS or len(ids) >= limit:
            break
    # Detokenized as the engine does (skip_special_tokens): control tokens dropped.
    return ids, "".join(p for p in pieces if p not in SKIPPED_IN_TEXT)


def test_ids_are_stable_across_processes() -> None:
    text = "<|im_start|>user\nHello, world 42!<|im_end|>\n"
    here = encode(text)
    code = f"from boomerang_tools.sim.tokenizer import encode; print(encode({text!r}))"
    # A fresh interpreter has a different PYTHONHASHSEED; the ids must not change.
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345"}).stdout.strip()
    assert str(here) == there
    assert here[0] == SPECIAL_TOKENS["<|im_start|>"] and here[-2] == IM_END


def test_text_round_trips_and_special_tokens_are_single() -> None:
    text = "A  internationalization\n\n<think>x</think>_tab\there ünïcödé 2026."
    ids = encode(text)
    assert TOKENIZER.decode(ids, skip_special_tokens=False) == text
    assert ids.count(SPECIAL_TOKENS["<think>"]) == 1 and ids.count(piece_id("\n")) == 2


def test_the_committed_files_are_what_the_builder_makes() -> None:
    """`python -m boomerang_tools.sim.hfmodel` rebuilds them; the build is deterministic."""
    built = hfmodel.build().to_str(pretty=True) + "\n"
    for thinking in (False, True):
        assert (hfmodel.folder(thinking) / "tokenizer.json").read_text(encoding="utf-8") == built


def test_every_generated_word_is_one_token() -> None:
    for word in WORDS:
        for form in (word, " " + word, word.capitalize(), " " + word.capitalize()):
            piece_id(form)
    for p in [*PUNCT, "\n", "<think>", "</think>", "<|im_end|>", "<|endoftext|>"]:
        piece_id(p)


@pytest.mark.parametrize("seed", range(20))
def test_tokens_of_concatenation_split_at_newlines(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["word", " word", ",", ".", " ", "  ", "\n", "<|im_end|>", "x1", "über", "_", "\t"]
    a = "".join(rng.choice(alphabet) for _ in range(40)) + rng.choice(["\n", "<|im_end|>", "<think>"])
    b = "".join(rng.choice(alphabet) for _ in range(40))
    assert encode(a + b) == encode(a) + encode(b)


def test_template_is_qwen_style() -> None:
    text = template.render([{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "U"}]}])
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    tools = template.render(
        [{"role": "user", "content": "q"},
         {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}],
        add_generation_prompt=False,
    )
    assert '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>' in tools
    assert tools.endswith("<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n")


@pytest.mark.parametrize("bad", [[], [{"role": "robot", "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_template_rejects_what_it_cannot_render(bad: list) -> None:  # type: ignore[type-arg]
    with pytest.raises(template.TemplateError):
        template.render(bad)


def test_strip_reasoning_only_before_the_last_user_turn() -> None:
    think = "<think>\nhmm\n</think>\n\nAnswer."
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": think}, {"role": "user", "content": "b"},
            {"role": "assistant", "content": think}, {"role": "tool", "content": "t"}]
    stripped = template.render(msgs, strip_reasoning=True)
    kept = template.render(msgs, strip_reasoning=False)
    assert stripped.count("<think>") == 1 and kept.count("<think>") == 2
    assert "<|im_start|>assistant\nAnswer.<|im_end|>" in stripped
    assert "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nAnswer.<|im_end|>" in stripped


def test_output_is_deterministic_and_depends_on_context() -> None:
    a, _ = _reply(list(range(100)))
    assert a == _reply(list(range(100)))[0]
    assert a != _reply(list(range(1, 101)))[0]
    assert a[-1] == IM_END and 12 < len(a) <= 50


@pytest.mark.parametrize("reasoning,strip,extends", [(False, False, True), (False, True, True), (True, False, True), (True, True, False)])
def test_next_prompt_extends_prompt_plus_output(reasoning: bool, strip: bool, extends: bool) -> None:
    """The property reuse depends on — and how Qwen3's reasoning stripping breaks it."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about caches."}]
    prompt = encode(template.render(msgs, strip_reasoning=strip))
    out_ids, text = _reply(prompt, reasoning)
    assert encode(text) == [i for i in out_ids if i != IM_END]
    nxt = encode(template.render(msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}],
                                 strip_reasoning=strip))
    assert (nxt[: len(prompt) + len(out_ids)] == prompt + out_ids) is extends
    assert nxt[: len(prompt)] == prompt
