"""Each table has one owner: the only code that names it in SQL (docs/design.md, "Who owns
which table"). The import rules cannot see a table read behind a string; this test can.

Every source file of the library, the services and the tools is read as text (nothing is
imported); SQL that names a table — `FROM t`, `JOIN t`, `UPDATE t`, `INSERT INTO t`,
`DELETE FROM t`, `COPY t`, `VACUUM t`, `'t'::regclass`, a COPY through asyncpg
(`copy_records_to_table("t")`) or a SQLAlchemy `Table` imported from `boomerang_server.db.models`
— must sit in the table's owner. Everyone else goes through the owner's module or its RPCs,
and the CLI runs no SQL of its own at all.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("libs/boomerang", "services", "tools/boomerang_tools")
SKIPPED = ("client/boomerang/v1/",)  # generated stubs: their comments quote the protos

REGISTRY = "services/registry/boomerang_registry/"
OWNERS: dict[str, tuple[str, ...]] = {
    "engines": (REGISTRY,),
    "leases": (REGISTRY,),
    "lease_events": (REGISTRY,),
    "database_epoch": (REGISTRY,),
    "turn_plans": ("services/router/boomerang_router/",),
    "reaper_leader": ("services/reaper/boomerang_reaper/",),
    "tenants": ("services/gateway/boomerang_gateway/tenants.py",),
    "credentials": ("libs/boomerang_server/credentials.py",),
}
# The schema itself (CREATE TABLE, partitions' DDL) is every table's, from the migrations.
SCHEMA = ("libs/boomerang_server/db/migrations/", "libs/boomerang_server/db/models.py")

# Fixtures, not services: they load, age and measure rows straight in a scratch database, as
# the tests do, and ship in no runtime package (the benchmark's SQL, and the fault campaign's
# checks, which read the tables as a witness independent of the services under test).
HARNESS = ("tools/boomerang_tools/bench/database.py", "tools/boomerang_tools/chaos/invariants.py")

# Known readers outside the owner, each with the reason it is still there. An entry that no
# longer matches anything fails the test too, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {
    ("services/registry/boomerang_registry/expiry.py", "reaper_leader"):
        "ExpireLeases and the other fenced RPCs check the caller's election term in the same "
        "transaction as their writes, so they read the reaper's row in place (FOR SHARE), never write it",
}

_TABLES = "|".join(sorted(OWNERS, key=len, reverse=True))
SQL = re.compile(
    rf"\b(?:FROM|JOIN|UPDATE|INSERT\s+INTO|DELETE\s+FROM|COPY|TRUNCATE|VACUUM(?:\s*\([^)]*\))?|ANALYZE)"
    rf"\s+(?:ONLY\s+)?(?P<a>{_TABLES})\b(?!\.)"
    rf"|copy_(?:records_)?to_table\(\s*[\"'](?P<b>{_TABLES})[\"']"
    rf"|'(?P<c>{_TABLES})'(?:::regclass|\s*\))"
)


def named_tables(source: str) -> Iterator[tuple[str, int]]:
    """Each (table, line) that `source` names in SQL or imports as a SQLAlchemy Table."""
    for m in SQL.finditer(source):
        yield m.group("a") or m.group("b") or m.group("c"), source.count("\n", 0, m.start()) + 1
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "boomerang_server.db.models":
            for alias in node.names:
                if alias.name in OWNERS:
                    yield alias.name, node.lineno


def sources() -> Iterator[tuple[str, str]]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(SKIPPED):
                yield rel, path.read_text()


def offenders() -> dict[tuple[str, str], list[int]]:
    """(file, table) → lines, for SQL naming a table outside its owner and the schema."""
    out: dict[tuple[str, str], list[int]] = {}
    for rel, text in sources():
        if rel.startswith(SCHEMA) or rel in HARNESS:
            continue
        for table, line in named_tables(text):
            if not rel.startswith(OWNERS[table]):
                out.setdefault((rel, table), []).append(line)
    return out


def test_every_table_has_an_owner() -> None:
    created = {m for path in (ROOT / SCHEMA[0] / "versions").glob("*.py")
               for m in re.findall(r"CREATE TABLE (\w+) \(", path.read_text())}
    assert created == set(OWNERS)


def test_sql_names_a_table_only_in_its_owner() -> None:
    found = offenders()
    unexpected = {f"{f}:{lines} names {t} (owner: {', '.join(OWNERS[t])})"
                  for (f, t), lines in found.items() if (f, t) not in ALLOWED}
    assert unexpected == set(), "go through the owner's module or its RPCs (docs/design.md)"


def test_the_allow_list_only_shrinks() -> None:
    stale = set(ALLOWED) - set(offenders())
    assert stale == set(), "remove these entries: the SQL they excused is gone"


def test_the_cli_runs_no_sql_of_its_own() -> None:
    """`boomerang status` and `audit` read the services: no CLI module runs SQL text or imports a statement."""
    found = []
    for path in sorted((ROOT / "services/cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                if (node.module or "").startswith("sqlalchemy") or any(n.endswith("_SQL") for n in names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {', '.join(sorted(names))}")
    assert found == [], "call the owner's function instead (docs/design.md, 'Who owns which table')"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('q = "SELECT count(*) FROM leases WHERE state = 1"', ["leases"]),
        ('q = """\nSELECT 1 FROM lease_events e LEFT JOIN leases l ON l.lease_id = e.lease_id"""', ["lease_events", "leases"]),
        ('q = "UPDATE leases SET state = 2"; r = "INSERT INTO turn_plans (a) VALUES (1)"', ["leases", "turn_plans"]),
        ('await c.copy_records_to_table("leases", records=r)', ["leases"]),
        ("q = \"SELECT pg_total_relation_size('leases'), 'lease_events'::regclass\"", ["leases", "lease_events"]),
        ("from boomerang_server.db.models import turn_plans", ["turn_plans"]),
        ('help = "the oldest are read back from turn_plans"', []),  # prose, not SQL
        ('x = "FROM turn_plans_default"; y = "SELECT turn_plans.plan_id"', []),
        ('q = "VACUUM (ANALYZE) leases"', ["leases"]),
    ],
)
def test_the_scan(source: str, expected: list[str]) -> None:
    assert [t for t, _ in named_tables(source)] == expected
