"""The operator commands on the database: `boomerang migrate` applies the migrations,
`boomerang credentials` issues, lists and revokes service and engine bearer tokens."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from pathlib import Path

from boomerang.auth import Principal
from boomerang_server.config import CommonSettings, load_settings, require_database
from boomerang_server.credentials import CredentialStore
from boomerang_server.db import make_engine, upgrade


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `migrate` and `credentials` subcommands."""
    migrate = subparsers.add_parser("migrate", help="apply database migrations")
    migrate.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    migrate.add_argument("--revision", default="heads", help="target revision (default: all heads)")
    migrate.set_defaults(handler=_migrate)

    parser = subparsers.add_parser("credentials", help="issue, list and revoke service/engine tokens")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="issue a token for service:NAME or engine:ENGINE_ID (printed once)")
    create.add_argument("principal")
    revoke = actions.add_parser("revoke", help="revoke every token of a principal")
    revoke.add_argument("principal")
    listing = actions.add_parser("list", help="list principals and when their tokens were issued or revoked")
    ensure = actions.add_parser(
        "ensure",
        help="make sure DIR/KIND-NAME.token holds a live token of each principal (issue one where it does not)",
        description="For each principal, keep the token in DIR/KIND-NAME.token when it is still valid, else issue "
        "a new one and write it there (mode 0600). Safe to run at every start-up, e.g. from a migration job.",
    )
    ensure.add_argument("--dir", required=True, help="directory of the token files (created if missing)")
    ensure.add_argument("principals", nargs="+", metavar="PRINCIPAL")
    for sub in (create, revoke, listing, ensure):
        sub.add_argument("--database-url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.set_defaults(handler=_credentials)


def _database_url(args: argparse.Namespace) -> str:
    # A bad value raises InvalidSettings, which `boomerang` reports in one line (failures.py).
    return require_database(load_settings(CommonSettings, database_url=args.database_url), args.command)


def _migrate(args: argparse.Namespace) -> int:
    upgrade(_database_url(args), args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def _credentials(args: argparse.Namespace) -> int:
    url = _database_url(args)
    try:
        principal = Principal.parse(args.principal) if args.action in ("create", "revoke") else None
        files = {Principal.parse(p): token_file(Path(args.dir), Principal.parse(p))
                 for p in args.principals} if args.action == "ensure" else {}
    except ValueError as exc:
        raise SystemExit(f"boomerang credentials: {exc}") from None
    return asyncio.run(_act(url, args.action, principal, files))


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def token_file(directory: Path, principal: Principal) -> Path:
    """`DIR/KIND-NAME.token`; ValueError for a name that is not a plain file name."""
    if not _SAFE_NAME.match(principal.name):
        raise ValueError(f"{principal}: only letters, digits, '.', '_' and '-' make a token file name")
    return directory / f"{principal.kind}-{principal.name}.token"


def write_private(path: Path, token: str) -> None:
    """Write `token` to `path` atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)


async def _act(url: str, action: str, principal: Principal | None, files: dict[Principal, Path]) -> int:
    await asyncio.to_thread(upgrade, url)
    engine = make_engine(url, pool_size=1)
    store = CredentialStore(engine, cache_seconds=0)
    try:
        if action == "ensure":
            for owner, path in files.items():
                current = path.read_text().strip() if path.is_file() else ""
                if current and await store.principal_for(current) == owner:
                    print(f"{owner}: kept {path}")
                    continue
                write_private(path, await store.create(owner))
                print(f"{owner}: issued {path}")
        elif action == "create":
            assert principal is not None
            token = await store.create(principal)
            print(f"{principal} {token}")
            print("# store this token now: only its hash is kept", flush=True)
        elif action == "revoke":
            assert principal is not None
            print(f"revoked {await store.revoke(principal)} token(s) of {principal}")
        else:
            for name, created, revoked in await store.list():
                print(f"{name}\tcreated {created}\t{'revoked ' + revoked if revoked else 'active'}")
    finally:
        await engine.dispose()
    return 0
