"""`boomerang migrate`: apply the database migrations."""

from __future__ import annotations

import argparse

from boomerang_server.config import CommonSettings, load_settings, require_database
from boomerang_server.db import upgrade


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `migrate` subcommand."""
    parser = subparsers.add_parser("migrate", help="apply database migrations")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    parser.add_argument("--revision", default="heads", help="target revision (default: all heads)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # A bad value raises InvalidSettings, which `boomerang` reports in one line (failures.py).
    url = require_database(load_settings(CommonSettings, database_url=args.database_url), "migrate")
    upgrade(url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0
