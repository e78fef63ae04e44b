"""Flags shared by service subcommands."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable
from typing import Any

import uvloop


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every service takes; each overrides its `BOOMERANG_*` variable."""
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    parser.add_argument("--db-pool-size", type=int, help="connections per process (BOOMERANG_DB_POOL_SIZE)")
    parser.add_argument("--grace-seconds", type=float, help="drain time on SIGTERM (BOOMERANG_GRACE_SECONDS)")
    parser.add_argument("--log-level", help="logging level (BOOMERANG_LOG_LEVEL)")
    parser.add_argument("--metrics-listen", help="HOST:PORT for /metrics (BOOMERANG_METRICS_LISTEN; default off)")


def common_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The common flags given on the command line."""
    return {
        "database_url": args.database_url,
        "db_pool_size": args.db_pool_size,
        "grace_seconds": args.grace_seconds,
        "log_level": args.log_level,
        "metrics_listen": args.metrics_listen,
    }


def require_database(settings: Any, command: str) -> None:
    """Exit with an actionable message when no database is configured for `command`."""
    try:
        settings.require_database()
    except ValueError as exc:
        raise SystemExit(f"boomerang {command}: {exc}") from None


def run_async(coro: Awaitable[Any]) -> Any:
    """Run a service's main coroutine on uvloop."""
    return uvloop.run(coro)  # type: ignore[arg-type]


__all__ = ["add_common_flags", "asyncio", "common_overrides", "require_database", "run_async"]
