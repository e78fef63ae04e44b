"""The registry's hot statements run on one path: the asyncpg pool, never through SQLAlchemy.

A hot statement handed to SQLAlchemy's `text()` anywhere in the registry would be a second
way to run it, one that tests could exercise while production does not (or the reverse).
"""

from __future__ import annotations

import ast
from pathlib import Path

from boomerang_registry import statements

PACKAGE = Path(statements.__file__).parent
HOT = {
    "CLAIM_SQL", "CLAIM_BATCH_SQL", "CONSUME_SQL", "REGISTER_BATCH_SQL", "RELEASE_SQL",
    "RELEASE_ENDED_SQL", "RELEASE_TARGET_SQL", "HEARTBEAT_SQL", "LEASE_SQL",
}
# The stores that hold only tenant-scoped or hot work: no SQLAlchemy at all.
POOL_ONLY = ("claim_store.py",)


def hot_statements_given_to_text(source: str) -> list[str]:
    """Names of hot statements passed to `text(...)` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "text":
            for arg in ast.walk(node):
                if isinstance(arg, ast.Name) and arg.id in HOT:
                    found.append(arg.id)
    return found


def test_every_hot_statement_is_a_constant_of_statements() -> None:
    assert all(isinstance(getattr(statements, name), str) for name in HOT)


def test_no_hot_statement_runs_through_sqlalchemy() -> None:
    offenders = {
        path.name: names
        for path in sorted(PACKAGE.glob("*.py"))
        if (names := hot_statements_given_to_text(path.read_text()))
    }
    assert offenders == {}


def test_the_checker_finds_a_hot_statement_given_to_text() -> None:
    assert hot_statements_given_to_text("rows = conn.execute(text(CLAIM_SQL), params)") == ["CLAIM_SQL"]
    assert hot_statements_given_to_text("rows = pool.fetch_as(t, CLAIM_SQL, params, 'ClaimReuse')") == []


def test_the_claim_store_does_not_import_sqlalchemy() -> None:
    for name in POOL_ONLY:
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m.split(".")[0] == "sqlalchemy" for m in imported), name

