"""`boomerang credentials`: issue, list and revoke service and engine bearer tokens."""

from __future__ import annotations

import argparse
import asyncio

from boomerang.config.settings import CommonSettings, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `credentials` subcommand."""
    parser = subparsers.add_parser("credentials", help="issue, list and revoke service/engine tokens")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="issue a token for service:NAME or engine:ENGINE_ID (printed once)")
    create.add_argument("principal")
    revoke = actions.add_parser("revoke", help="revoke every token of a principal")
    revoke.add_argument("principal")
    listing = actions.add_parser("list", help="list principals and when their tokens were issued or revoked")
    for sub in (create, revoke, listing):
        sub.add_argument("--database-url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from boomerang.auth import Principal

    settings = load_settings(CommonSettings, database_url=args.database_url)
    try:
        url = settings.require_database()
        principal = Principal.parse(args.principal) if args.action in ("create", "revoke") else None
    except ValueError as exc:
        raise SystemExit(f"boomerang credentials: {exc}") from None
    return asyncio.run(_act(url, args.action, principal))


async def _act(url: str, action: str, principal: object) -> int:
    from boomerang.auth import Principal
    from boomerang.credentials import CredentialStore
    from boomerang.db.engine import make_engine
    from boomerang.db.migrate import upgrade

    await asyncio.to_thread(upgrade, url)
    engine = make_engine(url, pool_size=1)
    store = CredentialStore(engine)
    try:
        if action == "create":
            assert isinstance(principal, Principal)
            token = await store.create(principal)
            print(f"{principal} {token}")
            print("# store this token now: only its hash is kept", flush=True)
        elif action == "revoke":
            assert isinstance(principal, Principal)
            print(f"revoked {await store.revoke(principal)} token(s) of {principal}")
        else:
            for name, created, revoked in await store.list():
                print(f"{name}\tcreated {created}\t{'revoked ' + revoked if revoked else 'active'}")
    finally:
        await engine.dispose()
    return 0
