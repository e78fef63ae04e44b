"""The simulator's model files: a real `tokenizer.json` and `tokenizer_config.json`, as vLLM loads them.

The tokenizer is a byte-level BPE built locally with the `tokenizers` library (nothing is
downloaded): text is first cut by the simulator's piece pattern — special tokens, each
newline on its own, a run of letters with at most one leading space, a digit, one other
character — then each piece is BPE-encoded over a vocabulary trained on the simulator's own
words, so every word the simulator generates is one token. Qwen's special tokens follow the
trained vocabulary (their ids are the file's, not Qwen's).
Because pieces never span a newline or a special token, the tokens of `a + b` are those of
`a` then those of `b` whenever `a` ends in one: a later turn's prompt re-tokenizes to the
earlier prompt plus the earlier output, as a real tokenizer does for a well-behaved template.

Two folders share the tokenizer: `plain` (a Qwen2.5-style chat template) and `thinking`
(Qwen3's, which strips `<think>…</think>` from assistant turns before the last user turn).
The simulator tokenizes with them, and a gateway pointed at them (`BOOMERANG_TOKENIZERS`)
tokenizes exactly as the simulator does. `python -m boomerang_tools.sim.hfmodel` rebuilds them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent / "hf"
# Qwen2/Qwen3's special tokens, in Qwen's order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>", "<think>", "</think>")
PIECE_PATTERN = r"\n| ?[^\W\d_]+|\d| ?[^\s\w]| ?_|[^\S\n]"
VOCAB = 4096
# The words the simulator writes (generate.py draws its replies from them).
_GENERATED = ("the a of to and in that it is was for on with as at by this from or be are have not but "
              "we they can will one all would there their what so if about which when make like time "
              "just know take into year good some could them see other than then now look only come "
              "its over think also back after use two how our work first well way even new want "
              "because any these give day most us cache block token prefill decode reuse turn engine "
              "router lease claim pull")
GENERATED_WORDS = tuple(_GENERATED.split())
# The vocabulary's words: those, then those the demo's tool output pads with.
_PADDING = ("handle request stream reply value index offset buffer queue worker session config limit "
            "result error retry commit table column select update insert where order group count batch "
            "chain hash prefix self none return def tool call name arguments weather city paris user "
            "assistant system")
WORDS = (*GENERATED_WORDS, *_PADDING.split())

_SHARED = (
    "{%- set ns = namespace(tools='', last_query=-1) -%}\n"
    "{%- if tools -%}\n"
    "{%- set ns.tools = '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>' -%}\n"
    "{%- for t in tools -%}{%- set ns.tools = ns.tools + '\\n' + (t | tojson(sort_keys=true)) -%}{%- endfor -%}\n"
    "{%- set ns.tools = ns.tools + '\\n</tools>' -%}\n"
    "{%- endif -%}\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role not in ['system', 'developer', 'user', 'assistant', 'tool'] -%}"
    "{{ raise_exception('messages: each role must be system, developer, user, assistant or tool') }}{%- endif -%}\n"
    "{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if ns.tools and messages[0].role not in ['system', 'developer'] -%}"
    "{{ '<|im_start|>system\\n' + ns.tools + '<|im_end|>\\n' }}{%- endif -%}\n"
    "{%- for m in messages -%}\n"
    "{%- set content = m.content if m.content is string else '' -%}\n"
    "{%- if m.role in ['system', 'developer'] -%}\n"
    "{{ '<|im_start|>system\\n' + content + (('\\n\\n' + ns.tools) if (ns.tools and loop.first) else '') + '<|im_end|>\\n' }}\n"
    "{%- elif m.role == 'user' -%}{{ '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "REASONING"
    "{{ '<|im_start|>assistant\\n' + content }}\n"
    "{%- for call in (m.tool_calls or []) -%}{%- set fn = call.function if call.function is defined else call -%}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + "
    "(fn.arguments if fn.arguments is string else (fn.arguments | tojson)) + '}\\n</tool_call>' }}{%- endfor -%}\n"
    "{{ '<|im_end|>\\n' }}\n"
    "{%- else -%}\n"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}\n"
    "{{ '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}\n"
)
# Qwen3: reasoning is what precedes `</think>` (or the message's `reasoning`); it is kept only
# after the last user turn.
_STRIP = (
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else none -%}\n"
    "{%- if reasoning is none and '</think>' in content -%}\n"
    "{%- set parts = content.rpartition('</think>') -%}\n"
    "{%- set reasoning = parts[0].split('<think>')[-1].strip('\\n') -%}{%- set content = parts[2].lstrip('\\n') -%}\n"
    "{%- endif -%}\n"
    "{%- if loop.index0 > ns.last_query and reasoning -%}"
    "{%- set content = '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -%}"
    "{%- endif -%}\n"
)
TEMPLATES = {"plain": _SHARED.replace("REASONING", ""), "thinking": _SHARED.replace("REASONING", _STRIP)}


# English and JSON of the kind the demo's agent sends (system prompt, tool schemas, a task),
# so such prompts take about as many tokens as with a real model's vocabulary.
TEXT = (
    ("You are a careful coding agent working in a large Python repository. Use the tools to read, search, "
    "edit and test the code; explain what you change and why. The user reports that the cache returns stale "
    "blocks after an engine restart. Find where the handle is checked, fix it, and make the tests pass."),
    ('{"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository and '
    'return its contents.", "parameters": {"type": "object", "properties": {"path": {"type": "string", '
    '"description": "the path"}}, "required": ["path"]}}}'),
    ("search_code: Search the repository for a regular expression. run_tests: Run the test suite, or one test "
    "file, and return the output. edit_file: Replace a range of lines in a file. list_dir: List a directory."),
    ("# Tools You may call one or more functions to assist with the user query. <tools> </tools> tool_call "
    "tool_response pattern target patch strict"),
)


def _corpus() -> list[str]:
    forms = [f for w in WORDS for f in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    return forms * 50 + list(TEXT) * 20


def build() -> Tokenizer:
    """The simulator's tokenizer, built from scratch (deterministic: same vocabulary every time)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    return tok


def config(name: str) -> dict[str, object]:
    """`tokenizer_config.json` of folder `name`."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATES[name], "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "model_max_length": 131072, "clean_up_tokenization_spaces": False}


def folder(thinking: bool) -> Path:
    """The folder of the simulator's model files (`--thinking`: Qwen3's template)."""
    return HERE / ("thinking" if thinking else "plain")


def write(root: Path = HERE) -> None:
    """Write both folders."""
    text = build().to_str(pretty=True)
    for name in TEMPLATES:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
        (root / name / "tokenizer_config.json").write_text(json.dumps(config(name), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
