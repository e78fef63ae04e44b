"""A Qwen-style chat template, rendered in Python (no Jinja).

Each message becomes `<|im_start|>{role}\n{content}<|im_end|>\n`; the generation prompt is
`<|im_start|>assistant\n`. Tool results are wrapped in `<tool_response>` inside a user turn
and an assistant's tool calls in `<tool_call>` (as Qwen2.5/Qwen3 do), tool definitions go in
the system turn.

With `strip_reasoning` (Qwen3's template) an assistant turn that precedes the last user
query loses its `<think>…</think>` block, while turns after it keep (or, from the
`reasoning` field, regain) `<think>\n…\n</think>\n\n`. This is the behaviour of
vLLM issue #43094: a decode node retained the thinking tokens, the next prompt no longer
contains them, so the prompt does not extend the retained sequence.

The messages are read as vLLM 0.33 hands them to a template: text parts joined by newlines,
a tool call's JSON arguments parsed (and written back with `json.dumps`), an assistant's
`reasoning` field as its reasoning, tools as `ChatCompletionToolsParam.model_dump()`. The
same template in Jinja is the chat template of the simulator's model files (`hfmodel`).
"""

from __future__ import annotations

import json
from typing import Any


class TemplateError(ValueError):
    """A message the template cannot render (reported as HTTP 400)."""


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise TemplateError(f"{where}: only text content parts are supported")
        return "\n".join(parts)
    raise TemplateError(f"{where}: content must be a string or a list of text parts")


def _split_reasoning(content: str, reasoning: str | None) -> tuple[str, str | None]:
    """Qwen3: reasoning is what precedes `</think>`; the answer is what follows it."""
    if reasoning is None and "</think>" in content:
        before, _, after = content.rpartition("</think>")
        reasoning = before.split("<think>")[-1].strip("\n")
        content = after.lstrip("\n")
    return content, reasoning


def _tool_calls(calls: Any, where: str) -> str:
    if not calls:
        return ""
    if not isinstance(calls, list):
        raise TemplateError(f"{where}.tool_calls: must be a list")
    out = []
    for call in calls:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TemplateError(f"{where}.tool_calls: each call needs function.name")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}  # vLLM coerces unparsable arguments to an empty object
        args_text = json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False)
        out.append(f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args_text}}}\n</tool_call>')
    return "".join(out)


def _tools_block(tools: list[Any] | None) -> str:
    if not tools:
        return ""
    lines = "\n".join(json.dumps(_tool_dump(t), ensure_ascii=False, sort_keys=True) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"<tools>\n{lines}\n</tools>"
    )


def _tool_dump(tool: Any) -> Any:
    """A tool as vLLM passes it to the template: unset description and parameters are null."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict):
        return tool
    dumped = {"name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")}
    dumped.update({k: fn[k] for k in ("strict", "defer_loading") if fn.get(k) is not None})
    return {"type": "function", "function": dumped}


def render(
    messages: Any,
    add_generation_prompt: bool = True,
    strip_reasoning: bool = False,
    tools: list[Any] | None = None,
) -> str:
    """The prompt text for a chat request."""
    if not isinstance(messages, list) or not messages:
        raise TemplateError("messages: must be a non-empty list")
    roles = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise TemplateError(f"messages[{i}].role: must be system, developer, user, assistant or tool")
        roles.append(m["role"])
    last_query = max((i for i, r in enumerate(roles) if r == "user"), default=-1)
    out: list[str] = []
    tools_text = _tools_block(tools)
    if tools_text and roles[0] not in ("system", "developer"):
        out.append(f"<|im_start|>system\n{tools_text}<|im_end|>\n")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = "system" if roles[i] == "developer" else roles[i]
        content = _text(m.get("content"), f"{where}.content")
        if role == "system":
            body = content + ("\n\n" + tools_text if tools_text and i == 0 else "")
            out.append(f"<|im_start|>system\n{body}<|im_end|>\n")
        elif role == "user":
            out.append(f"<|im_start|>user\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning = m.get("reasoning")
            if strip_reasoning:
                content, reasoning = _split_reasoning(content, reasoning if isinstance(reasoning, str) else None)
                if i > last_query and reasoning:
                    content = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
            out.append(f"<|im_start|>assistant\n{content}{_tool_calls(m.get('tool_calls'), where)}<|im_end|>\n")
        else:  # tool results, consecutive ones grouped in one user turn
            if i == 0 or roles[i - 1] != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or roles[i + 1] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
