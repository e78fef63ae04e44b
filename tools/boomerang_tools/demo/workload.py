"""Multi-turn agent conversations that grow to AWS's context lengths, sized to the token.

A conversation is what a coding agent sends: a system prompt with tool definitions, the
user's task, then rounds of tool results and the model's own replies, the whole history
resent every turn. For each measured context length `c` it takes two steps:

* a *grow* turn — a large tool result (a file read, a search) that brings the prompt to
  about `c − NEW_TOKENS − a reply`;
* a *probe* turn — a short tool result that brings the prompt to exactly `c`, so the
  turn adds about `NEW_TOKENS` (128) tokens to what the decode node holds, as the cost
  model assumes for AWS's measurements. Its time to first token is the row of the table.

Prompts are counted with the simulator's own chat template and tokenizer, so the probe's
prompt is exactly `c` tokens. Content is deterministic per seed; the model's replies are
deterministic per context, so the same conversation replays identically with Boomerang
off and on (which the demo checks).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from boomerang_tools.sim import template
from boomerang_tools.sim.tokenizer import encode

NEW_TOKENS = 128
REPLY_ESTIMATE = 20  # tokens; the demo caps replies at MAX_REPLY_TOKENS
MAX_REPLY_TOKENS = 24

# Context lengths measured per profile: AWS's range (2k to 24k for Qwen3-32B, to 20k for GLM-5),
# and the H200 measurements' (2k to 24k); --quick: the first, 8k and the last.
_TO_24K = (2000, 4000, 8000, 12000, 16000, 20000, 24000)
POINTS: dict[str, tuple[int, ...]] = {
    "qwen3-32b": _TO_24K,
    "glm-5-fp8": _TO_24K[:-1],
    "qwen3-32b-h200": _TO_24K,
    "qwen3-8b-h200": _TO_24K,
}
QUICK_POINTS: dict[str, tuple[int, ...]] = {p: (c[0], 8000, c[-1]) for p, c in POINTS.items()}

_TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {arg: {"type": "string", "description": f"the {arg}"}}, "required": [arg]}}}
    for name, desc, arg in (
        ("read_file", "Read a file of the repository and return its contents.", "path"),
        ("search_code", "Search the repository for a regular expression.", "pattern"),
        ("run_tests", "Run the test suite, or one test file, and return the output.", "target"),
        ("edit_file", "Replace a range of lines in a file.", "patch"),
        ("list_dir", "List a directory of the repository.", "path"),
    )
]
_WORDS = ["cache", "block", "token", "prefill", "decode", "lease", "claim", "router", "engine", "handle", "request", "stream", "reply", "value", "index", "offset", "buffer", "queue", "worker", "session", "config", "limit", "result", "error", "retry", "commit", "table", "column", "select", "update", "insert", "where", "order", "group", "count", "batch", "chain", "hash", "prefix"]
_PAD = [w for w in _WORDS if len(w) <= 8]


def _count(text: str) -> int:
    return len(encode(text))


def _code_line(rng: random.Random) -> str:
    a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
    kind = rng.random()
    if kind < 0.3:
        return f"    def {a}_{b}(self, {c}):"
    if kind < 0.6:
        return f"        return self.{a}.{b}({c}, {rng.randint(0, 99)})"
    if kind < 0.8:
        return f"        if {a} is None or {b} > {c}:"
    return f"    # the {a} keeps the {b} of each {c}"


def filler(rng: random.Random, tokens: int, header: str = "") -> str:
    """Tool output of exactly `tokens` tokens (lines of code-like text, then padding words)."""
    lines, used = [], 0
    if header:
        head = header + "\n"
        if _count(head) <= tokens:
            lines.append(head)
            used += _count(head)
    while True:
        line = f"{len(lines) + 1:4d}  {_code_line(rng)}\n"
        n = _count(line)
        if used + n > tokens:
            break
        lines.append(line)
        used += n
    # Each padding word (" cache", " block", …) is exactly one token.
    lines.append("".join(" " + rng.choice(_PAD) for _ in range(tokens - used)))
    return "".join(lines)


@dataclass
class Step:
    """One turn to send: which measured context it belongs to and whether it is measured."""

    point: int
    probe: bool


@dataclass
class AgentConversation:
    """The history of one agent session and how to grow it."""

    seed: int
    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if not self.messages:
            self.messages = [
                {"role": "system", "content": (
                    "You are a careful coding agent working in a large Python repository. Use the tools "
                    "to read and search code before you change it, run the tests after every edit, and "
                    "answer with the next tool call or a short summary.")},
                {"role": "user", "content": (
                    "The KV-cache reuse path returns stale blocks after an engine restart. Find where the "
                    "handle is checked, fix it, and make the tests pass.")},
            ]

    def body(self) -> dict[str, Any]:
        """The chat request for the next turn (without Boomerang's fields)."""
        return {"model": self.model, "messages": list(self.messages), "tools": _TOOLS,
                "max_tokens": MAX_REPLY_TOKENS, "temperature": 0}

    def prompt_tokens(self, extra: list[dict[str, Any]] | None = None) -> int:
        """The prompt length of the next turn, as the simulated engines count it."""
        text = template.render(self.messages + (extra or []), add_generation_prompt=True, tools=_TOOLS)
        return _count(text)

    def add_tool_result(self, target: int, header: str) -> int:
        """Append a tool result that makes the next prompt `target` tokens (or as near as
        possible when the history is already longer); returns the prompt length."""
        base = self.prompt_tokens([{"role": "tool", "content": ""}])
        content = filler(self.rng, max(0, target - base), header)
        self.messages.append({"role": "tool", "content": content})
        return self.prompt_tokens()

    def add_reply(self, text: str) -> None:
        """Append the model's reply, as an agent framework does."""
        self.messages.append({"role": "assistant", "content": text})


def steps(points: tuple[int, ...]) -> list[Step]:
    """A grow turn then a probe turn for each measured context length."""
    return [s for p in points for s in (Step(p, False), Step(p, True))]


def prepare(conv: AgentConversation, step: Step) -> int:
    """Append the tool result for `step`; returns the prompt length it gives."""
    if step.probe:
        return conv.add_tool_result(step.point, "$ run_tests tests/unit/test_cache.py  # exit code 0")
    target = step.point - NEW_TOKENS - REPLY_ESTIMATE
    return conv.add_tool_result(target, f"read_file src/boomerang/block_{step.point}.py")
