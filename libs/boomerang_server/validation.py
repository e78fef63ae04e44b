"""Field rules every Boomerang API shares, so a value valid at one service is valid at all.

Each check records a violation naming the field (see `boomerang.errors.Violations`).
"""

from __future__ import annotations

import re

from boomerang.errors import Violations

MAX_ID = 128
MAX_CONVERSATION_ID = 256
MAX_TEXT = 512
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


def has_control_characters(value: str) -> bool:
    """Whether `value` holds a C0 control character or DEL (Postgres refuses NUL)."""
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in value)


def _present_within(v: Violations, path: str, value: str, limit: int, required: bool) -> bool:
    """Whether `value` is given and at most `limit` characters, its characters still to check;
    records why not (an empty optional value is fine, and has nothing to check)."""
    if not value:
        if required:
            v.add(path, "is required")
        return False
    if len(value) > limit:
        v.add(path, f"must be at most {limit} characters, got {len(value)}")
        return False
    return True


def check_id(v: Violations, path: str, value: str, limit: int = MAX_ID, required: bool = True) -> None:
    """An identifier: printable ASCII without spaces, at most `limit` characters."""
    if _present_within(v, path, value, limit, required) and not _PRINTABLE.match(value):
        v.add(path, "must be printable ASCII without spaces")


def check_text(v: Violations, path: str, value: str, limit: int = MAX_TEXT, required: bool = False) -> None:
    """Free text (a model name, a host): no control characters, at most `limit` characters."""
    if _present_within(v, path, value, limit, required) and has_control_characters(value):
        v.add(path, "must not contain control characters")


def check_conversation(v: Violations, path: str, value: str, required: bool = True) -> None:
    """A conversation id: any text but control characters, at most 256 characters."""
    check_text(v, path, value, MAX_CONVERSATION_ID, required)
