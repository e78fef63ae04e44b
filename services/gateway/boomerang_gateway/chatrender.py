"""A chat request rendered to prompt text exactly as vLLM 0.33.0 renders it, for text-only chats.

vLLM's OpenAI server turns the request's messages into a "conversation"
(`vllm.renderers.chat_utils.parse_chat_messages`), picks the content format the template
expects (`vllm.renderers.hf._detect_content_format`), and renders it with transformers'
`apply_chat_template` (`transformers.utils.chat_template_utils`): a sandboxed Jinja
environment with `trim_blocks`/`lstrip_blocks`, its own `tojson`, `raise_exception` and
`strftime_now`, the tokenizer's named special tokens as variables. The text is then
tokenized with the request's `add_special_tokens` (false for chat: the template writes BOS).

Only what this module mirrors exactly is rendered; anything else (images, audio, custom
part types, a request's own `chat_template`, `reasoning_effort`, truncation, …) raises
`Unsupported`, and the caller asks the prefill engine's `/tokenize` instead. The real-vLLM
suite (tests/vllm/test_local_tokenize.py) checks this module against vLLM token for token.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Parts vLLM reads as text (`TEXT_PART_TYPES`); others carry media and are not rendered here.
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
# vLLM drops this line from system text (`_strip_claude_code_billing_header`); not mirrored.
_BILLING_HEADER = "x-anthropic-billing-header"
# Request fields that change vLLM's rendering in ways not mirrored here.
UNSUPPORTED_FIELDS = ("chat_template", "reasoning_effort", "truncate_prompt_tokens", "media_io_kwargs",
                      "mm_processor_kwargs", "prompt_embeds")
# `apply_chat_template`'s own parameters: as chat_template_kwargs they change the call, not the template.
_HF_PARAMS = frozenset({"conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                        "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
                        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                        "tokenizer_kwargs"})
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class Unsupported(Exception):
    """A request this module does not render exactly as vLLM; ask the engine instead."""


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` tag, which renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - declared so by jinja2.ext.Extension

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' own filter: no HTML escaping, unlike Jinja's.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template as transformers compiles it (cached: templates are a few per model)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@lru_cache(maxsize=16)
def template_info(source: str) -> tuple[bool, frozenset[str], bool]:
    """(content as OpenAI parts?, the template's free variables, does it know `developer`?)."""
    tree = compile_template(source).environment.parse(source)
    developer = '"developer"' in source or "'developer'" in source
    return _iterates_content(tree), frozenset(meta.find_undeclared_variables(tree)), developer


def _is_name(node: jinja2.nodes.Node, names: set[str]) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name in names


def _strip(node: jinja2.nodes.Node) -> jinja2.nodes.Node:
    """`x | filter`, `x is test` and `x[a:b]` read `x`, as vLLM's detection treats them."""
    while True:
        inner: jinja2.nodes.Node | None = None
        if isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
            inner = node.node  # None only for a `{% filter %}` block's filter
        elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            inner = node.node
        if inner is None:
            return node
        node = inner


def _reads_key(node: jinja2.nodes.Node, names: set[str], key: str) -> bool:
    node = _strip(node)
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_name(node.node, names) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    return isinstance(node, jinja2.nodes.Getattr) and _is_name(node.node, names) and node.attr == key


def _iterates_content(tree: jinja2.nodes.Template) -> bool:
    """vLLM's `_detect_content_format`: "openai" when the template loops over a message's
    content (`for part in message['content']`, or over a variable named `content` outside a
    macro); "string" otherwise. Aliases of `messages` by assignment are followed, as vLLM does."""
    aliases, grew = {"messages"}, True
    while grew:
        grew = False
        for assign in tree.find_all(jinja2.nodes.Assign):
            if (isinstance(assign.target, jinja2.nodes.Name) and assign.target.name not in aliases
                    and _is_name(_strip(assign.node), aliases)):
                aliases.add(assign.target.name)
                grew = True
    message_vars = {loop.target.name for loop in tree.find_all(jinja2.nodes.For)
                    if isinstance(loop.target, jinja2.nodes.Name) and _is_name(_strip(loop.iter), aliases)}
    in_macros = {id(loop) for macro in tree.find_all(jinja2.nodes.Macro) for loop in macro.find_all(jinja2.nodes.For)}
    for loop in tree.find_all(jinja2.nodes.For):
        if _reads_key(loop.iter, message_vars, "content"):
            return True
        if id(loop) not in in_macros and _is_name(loop.iter, {"content"}):
            return True
    if in_macros:
        # vLLM also follows message content passed to a macro parameter; not mirrored.
        raise Unsupported("the template loops inside a macro")
    return False


def _texts(content: Any, where: str) -> Iterator[str]:
    if content is None:
        return
    if isinstance(content, str):
        yield content
        return
    if not isinstance(content, list):
        raise Unsupported(f"{where}: content is neither text nor a list of parts")
    for part in content:
        if isinstance(part, str) or (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)
              and set(part) <= {"type", "text"}):
            yield part if isinstance(part, str) else part["text"]
        else:
            raise Unsupported(f"{where}: a content part other than text")


def _tool_calls(calls: list[Any]) -> list[Any]:
    """vLLM's `_postprocess_messages`: each call's JSON `arguments` become a dict ({} when empty or not an object)."""
    out = copy.deepcopy(calls)
    for call in out:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type", "function") != "function":
            raise Unsupported("a tool call other than a function")
        args = fn.get("arguments")
        if not args:
            fn["arguments"] = {}
        elif isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            fn["arguments"] = parsed if isinstance(parsed, dict) else {}
        elif not isinstance(args, dict):
            fn["arguments"] = {}
    return out


def conversation(messages: Any, openai_parts: bool, developer_role: bool) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to the template (`parse_chat_messages`)."""
    if not isinstance(messages, list) or not messages:
        raise Unsupported("messages: not a non-empty list")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise Unsupported(f"messages[{i}]: no role")
        role = msg["role"]
        texts = list(_texts(msg.get("content"), f"messages[{i}]"))
        if role == "system" and any(t.startswith(_BILLING_HEADER) for t in texts):
            raise Unsupported("a system prompt vLLM edits")
        item: dict[str, Any] = {"role": role}
        if openai_parts and role != "tool":
            item["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            item["content"] = "\n".join(texts)
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                if not isinstance(msg["tool_calls"], list):
                    raise Unsupported("tool_calls: not a list")
                if msg["tool_calls"]:
                    item["tool_calls"] = _tool_calls(msg["tool_calls"])
            if msg.get("reasoning") is not None:
                if not isinstance(msg["reasoning"], str):
                    raise Unsupported("reasoning: not text")
                item["reasoning"] = item["reasoning_content"] = msg["reasoning"]
        elif role == "tool" and "tool_call_id" in msg:
            item["tool_call_id"] = msg["tool_call_id"]
        if isinstance(msg.get("name"), str):
            item["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            item["task"] = msg["task"]
        if role == "developer":
            item["tools"] = msg.get("tools")
        out.append(item)
    if any(m["role"] == "developer" for m in out) and not developer_role:
        raise Unsupported("developer messages for a template without that role")
    return out


def tool_schemas(tools: Any) -> list[dict[str, Any]] | None:
    """The request's tools as vLLM passes them (`ChatCompletionToolsParam.model_dump()`)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise Unsupported("tools: not a list")
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
            raise Unsupported("a tool other than a named function")
        dumped: dict[str, Any] = {"name": fn["name"], "description": fn.get("description"),
                                  "parameters": fn.get("parameters")}
        for key in ("strict", "defer_loading"):
            value = fn.get(key, tool.get(key) if key == "defer_loading" else None)
            if value is not None:
                dumped[key] = value
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out or None


def render(source: str, body: dict[str, Any], special_tokens: dict[str, str]) -> str:
    """The prompt text vLLM renders for a chat request `body` with template `source`."""
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) is not None:
            raise Unsupported(f"{key} is set")
    openai_parts, variables, developer = template_info(source)
    chat = conversation(body.get("messages"), openai_parts, developer)
    user_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(user_kwargs, dict) or set(user_kwargs) & _HF_PARAMS:
        raise Unsupported("chat_template_kwargs that change the call")
    add_generation_prompt = body.get("add_generation_prompt", True)
    continue_final = bool(body.get("continue_final_message", False))
    if continue_final and add_generation_prompt:
        raise Unsupported("continue_final_message with add_generation_prompt")
    kwargs = {**special_tokens, **{k: v for k, v in user_kwargs.items() if k in variables}}
    final_text = None
    if continue_final:
        chat, final_text = _tag_final(chat, source)
    try:
        text = compile_template(source).render(messages=chat, tools=tool_schemas(body.get("tools")),
                                               documents=body.get("documents"),
                                               add_generation_prompt=bool(add_generation_prompt), **kwargs)
    except jinja2.TemplateError as exc:
        raise Unsupported(f"the template refused the request: {exc}") from None
    if final_text is not None:
        text = _untag_final(text, final_text)
    return text


def _tag_final(chat: list[dict[str, Any]], source: str) -> tuple[list[dict[str, Any]], str]:
    """transformers' `continue_final_message`: mark the end of the last message's text."""
    if "content" not in source:
        raise Unsupported("continue_final_message with a template that never reads content")
    chat = copy.deepcopy(chat)
    final = chat[-1]["content"]
    if isinstance(final, list):
        if not final:
            raise Unsupported("continue_final_message without text to continue")
        text = final[-1]["text"]
        final[-1]["text"] = text + _CONTINUE_TAG
        return chat, text
    chat[-1]["content"] = final + _CONTINUE_TAG
    return chat, final


def _untag_final(rendered: str, final_text: str) -> str:
    if final_text.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise Unsupported("continue_final_message: the template drops the final message")
    loc = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[loc: loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:loc]
    return rendered[:loc].rstrip()
