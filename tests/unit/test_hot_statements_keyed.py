"""Every hot statement is keyed by tenant and conversation: the path to a distributed Postgres.

On Citus distributed by tenant (README, "Beyond one Postgres primary"), `leases`,
`lease_events` and `turn_plans` are distributed tables co-located on `tenant`, and a
statement runs on one shard only when every access to them names its tenant. The claim,
the registration, consume and expiry (registry) and the `turn_plans` upsert (router) are
read here as SQL text: every row they write carries `tenant` and `conversation_id`, every
UPDATE of a distributed table and every join to one is keyed on both, and every scan that
selects rows is keyed on the tenant and the conversation (consume: the tenant and the
lease's primary key; the expiry sweep is the one scan across tenants, by design: on Citus
it runs per shard). The checker is tested against statements that break each rule.
"""

from __future__ import annotations

import re

import pytest
from boomerang_registry import expiry, statements
from boomerang_router import repository as router_repository

DISTRIBUTED = ("leases", "lease_events", "turn_plans")
KEYS = ("tenant", "conversation_id")
_TOKEN = re.compile(r"'(?:[^']|'')*'|::|:\w+|\w+(?:\.\w+)?|\S")
# Words that end a condition at its own parenthesis depth.
_ENDS = {"returning", "for", "order", "limit", "group", "union", "join", "where", "on", "select", "from",
         "set", "values", "cross", "left", "inner", "having", "offset"}


def tokens(sql: str) -> list[str]:
    return _TOKEN.findall(re.sub(r"--[^\n]*", "", sql))  # comments out first: "claim's" is no string


def condition(toks: list[str], start: int) -> str:
    """The condition beginning at `start`, up to the next clause at its own depth."""
    depth, out = 0, []
    for tok in toks[start:]:
        low = tok.lower()
        if tok == "(":
            depth += 1
        elif tok == ")":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (low in _ENDS or tok == ","):
            break
        out.append(tok)
    return " ".join(out)


def keyed(cond: str, alias: str, keys: tuple[str, ...]) -> bool:
    """Whether `cond` holds an equality on each key of the relation `alias`."""
    names = {f"{alias}.{k}" for k in keys} | ({k for k in keys} if not alias else set())
    found = set()
    parts = cond.split()
    for i, tok in enumerate(parts):
        low = tok.lower()
        if (low in names or (not alias and low in keys)) and "=" in parts[max(0, i - 1): i + 2]:
            found.add(low.rsplit(".", 1)[-1])
    return set(keys) <= found


def violations(sql: str, scan_keys: tuple[str, ...] = KEYS, sweep: bool = False) -> list[str]:
    """What in `sql` is not keyed: writes without the keys, updates, joins and scans of
    distributed tables not keyed on tenant and conversation."""
    toks = tokens(sql)
    low = [t.lower() for t in toks]
    found: list[str] = []
    for i, tok in enumerate(low):
        nxt = low[i + 1] if i + 1 < len(low) else ""
        if tok == "into" and nxt in DISTRIBUTED:  # INSERT INTO t [AS a] (cols)
            j = i + 2
            if low[j] == "as":
                j += 2
            cols = []
            if toks[j] == "(":
                k = j + 1
                while toks[k] != ")":
                    cols.append(low[k])
                    k += 1
            if not set(KEYS) <= set(cols):
                found.append(f"INSERT INTO {nxt} without {', '.join(k for k in KEYS if k not in cols)}")
        elif tok in ("update", "join", "from") and nxt in DISTRIBUTED:
            alias = ""
            j = i + 2
            if j < len(low) and low[j] == "as":
                j += 1
            if j < len(low) and re.fullmatch(r"[a-z_]\w*", low[j]) and low[j] not in _ENDS | {"as"}:
                alias, j = low[j], j + 1
            # The conditions that select its rows: an UPDATE's WHERE, a JOIN's ON, and for a
            # FROM the WHERE and the ON of every join in that FROM clause.
            words = {"update": ("where",), "join": ("on",), "from": ("where", "on")}[tok]
            depth, conds = 0, []
            while j < len(low):
                if low[j] == "(":
                    depth += 1
                elif low[j] == ")":
                    if depth == 0:
                        break
                    depth -= 1
                elif depth == 0 and low[j] in words:
                    conds.append(condition(toks, j + 1))
                    if tok != "from":
                        break
                elif depth == 0 and low[j] in ("union", "returning", "for", "order", "limit", "group"):
                    break
                j += 1
            cond = " AND ".join(conds)
            if tok == "from" and sweep:
                continue
            keys = KEYS if tok in ("update", "join") else scan_keys
            if not keyed(cond, alias, keys):
                found.append(f"{tok.upper()} {nxt} {alias}: not keyed on {'/'.join(keys)} in {cond[:120]!r}")
    return found


HOT = {
    "registry claim": (statements.CLAIM_SQL, KEYS, False),
    "registry claim batch": (statements.CLAIM_BATCH_SQL, KEYS, False),
    "registry registration": (statements.REGISTER_BATCH_SQL, KEYS, False),
    "registry consume": (statements.CONSUME_SQL, ("tenant", "lease_id"), False),
    "registry release": (statements.RELEASE_SQL, ("tenant", "lease_id"), False),
    "registry release, ended": (statements.RELEASE_ENDED_SQL, ("tenant", "lease_id"), False),
    "registry expiry": (expiry.EXPIRE_SQL, KEYS, True),
    "router turn_plans upsert": (router_repository.UPSERT_SQL, KEYS, False),
}


@pytest.mark.parametrize("name", list(HOT))
def test_every_hot_statement_is_keyed_by_tenant_and_conversation(name: str) -> None:
    sql, scan_keys, sweep = HOT[name]
    assert any(t in sql for t in DISTRIBUTED)
    assert violations(sql, scan_keys, sweep) == []


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("INSERT INTO lease_events (lease_id, tenant, reason) SELECT 1", "INSERT INTO lease_events without conversation_id"),
        ("WITH x AS (SELECT 1) UPDATE leases l SET state = 'A' FROM x WHERE l.lease_id = x.lease_id", "UPDATE leases l"),
        ("SELECT 1 FROM x JOIN leases l ON l.lease_id = x.lease_id AND l.tenant = :t", "JOIN leases l"),
        ("SELECT lease_id FROM leases l WHERE l.tenant = :t AND l.state = 'RETAINED'", "FROM leases l"),
        ("SELECT lease_id FROM leases WHERE state = 'RETAINED' AND expires_at <= now()", "FROM leases"),
    ],
)
def test_the_checker_finds_what_is_not_keyed(sql: str, expected: str) -> None:
    found = violations(sql)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_the_checker_accepts_keyed_statements() -> None:
    ok = ("WITH o AS (SELECT lease_id, tenant, conversation_id FROM leases WHERE tenant = :t "
          "AND conversation_id = :c FOR UPDATE) UPDATE leases l SET state = 'X' FROM o "
          "WHERE l.tenant = o.tenant AND l.conversation_id = o.conversation_id AND l.lease_id = o.lease_id")
    assert violations(ok) == []
