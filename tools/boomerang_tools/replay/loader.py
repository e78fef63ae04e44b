"""Recorded conversations in, turns out: JSONL of OpenAI chat requests, or ShareGPT JSON.

JSONL: one chat request per line, in the order they were sent — the body itself
(`{"model", "messages", "conversation_id", …}`) or `{"conversation_id", "request": {…}}`;
the conversation id may also be in `metadata.conversation_id` or the `X-Conversation-Id`
of `headers`. Each line is one turn with its recorded history.

ShareGPT: a JSON list of `{"id", "conversations": [{"from": "system"|"human"|"gpt", "value"}]}`
(vLLM's multi-turn benchmark format). Each human message is one turn; the history it
carries is built during the replay from the endpoint's own replies, as a live client's
would be (so the next prompt really extends what the decode engine retained).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "tool": "tool"}


class ReplayFormatError(ValueError):
    """The file is not a supported format; the message names the line or entry."""


@dataclass
class Turn:
    """One request to send: a recorded body, or the next user message of a live history."""

    body: dict[str, Any] | None = None  # JSONL: the recorded request (messages included)
    user: dict[str, Any] | None = None  # ShareGPT: the new message; history is built live


@dataclass
class Conversation:
    """A recorded conversation."""

    conversation_id: str
    turns: list[Turn] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)  # ShareGPT: leading system messages


def _conversation_id(obj: dict[str, Any]) -> str:
    for value in (obj.get("conversation_id"), (obj.get("metadata") or {}).get("conversation_id"),
                  {k.lower(): v for k, v in (obj.get("headers") or {}).items()}.get("x-conversation-id")):
        if isinstance(value, (str, int)) and str(value):
            return str(value)
    return ""


def load_jsonl(text: str) -> list[Conversation]:
    """Recorded chat requests, grouped by conversation id in first-seen order."""
    convs: dict[str, Conversation] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ReplayFormatError(f"line {n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ReplayFormatError(f"line {n}: must be a JSON object")
        body: dict[str, Any] = obj["request"] if isinstance(obj.get("request"), dict) else obj
        cid = _conversation_id(obj) or _conversation_id(body)
        if not cid:
            raise ReplayFormatError(f"line {n}: no conversation_id (body field, metadata or X-Conversation-Id header)")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ReplayFormatError(f"line {n}: a chat request needs a non-empty messages list")
        clean = {k: v for k, v in body.items() if k not in ("conversation_id", "metadata", "headers", "stream",
                                                            "stream_options", "kv_transfer_params")}
        convs.setdefault(cid, Conversation(cid)).turns.append(Turn(body=clean))
    return list(convs.values())


def load_sharegpt(data: Any) -> list[Conversation]:
    """ShareGPT conversations; each human message becomes a turn."""
    if isinstance(data, dict):
        data = data.get("conversations") if isinstance(data.get("conversations"), list) else [data]
    if not isinstance(data, list):
        raise ReplayFormatError("ShareGPT JSON must be a list of conversations")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise ReplayFormatError(f"entry {i}: needs a 'conversations' list")
        conv = Conversation(str(entry.get("conversation_id") or entry.get("id") or f"sharegpt-{i}"))
        for j, msg in enumerate(entry["conversations"]):
            role = _ROLES.get(str(msg.get("from", msg.get("role", ""))).lower()) if isinstance(msg, dict) else None
            text = msg.get("value", msg.get("content")) if isinstance(msg, dict) else None
            if role is None or not isinstance(text, str):
                raise ReplayFormatError(f"entry {i} message {j}: needs 'from' (human/gpt/system) and a string 'value'")
            if role == "system" and not conv.turns:
                conv.system.append({"role": "system", "content": text})
            elif role in ("user", "tool"):
                conv.turns.append(Turn(user={"role": role, "content": text}))
        if conv.turns:
            out.append(conv)
    return out


def load(path: Path) -> list[Conversation]:
    """Conversations from a file, by its content: a JSON document that is a list (or has a
    `conversations` list) is ShareGPT; anything else is JSONL."""
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, list) or (isinstance(whole, dict) and isinstance(whole.get("conversations"), list)):
        return load_sharegpt(whole)
    return load_jsonl(text)
