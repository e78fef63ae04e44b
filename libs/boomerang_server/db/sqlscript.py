"""Split a SQL script into statements (asyncpg prepares one statement at a time)."""

from __future__ import annotations


def split_statements(script: str) -> list[str]:
    """Statements of `script`, split on `;` outside quotes, `$$` bodies and `--` comments."""
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(script)
    in_dollar = in_quote = in_comment = False
    while i < n:
        ch = script[i]
        if in_comment:
            if ch == "\n":
                in_comment = False
            i += 1
            continue
        if not in_dollar and not in_quote and script.startswith("--", i):
            in_comment = True
            i += 2
            continue
        if not in_quote and script.startswith("$$", i):
            in_dollar = not in_dollar
            current.append("$$")
            i += 2
            continue
        if not in_dollar and ch == "'":
            in_quote = not in_quote
        if ch == ";" and not in_dollar and not in_quote:
            stmt = "".join(current).strip()
            if stmt:
                statements.append(stmt)
            current = []
        else:
            current.append(ch)
        i += 1
    tail = "".join(current).strip()
    if tail:
        statements.append(tail)
    return statements
