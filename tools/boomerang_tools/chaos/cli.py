"""`boomerang chaos [--seconds N] [--seed N]`: the randomized fault campaign (campaign.py)."""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from boomerang_tools.chaos.campaign import Settings, report, run
from boomerang_tools.stack.children import ChildFailed
from boomerang_tools.stack.postgres import PostgresError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `chaos` subcommand."""
    parser = subparsers.add_parser(
        "chaos",
        help="converse through the gateway while seeded random faults hit every part; check the invariants",
        description="Start two replicas of every service, two prefill and two decode simulated engines and a "
        "highly available Postgres (Patroni on etcd, three nodes); let AGENTS conversations talk through the "
        "gateways while faults drawn from SEED run (SIGKILL or SIGSTOP of any replica or engine, the Postgres "
        "primary killed, a Postgres restart, overlapping); then print the faults, the seed and each invariant "
        "with its count. Exits 1 when an invariant does not hold.",
    )
    parser.add_argument("--seconds", type=float, default=600, help="length of the run (default 600; at least 90)")
    parser.add_argument("--seed", type=int, help="the faults' seed (default: a random one, printed)")
    parser.add_argument("--agents", type=int, default=64, help="concurrent conversations (default 64)")
    parser.add_argument("--asynchronous", action="store_true",
                        help="asynchronous replication (default: Patroni's synchronous_mode)")
    parser.add_argument("--data-dir", type=Path,
                        help="logs and the engines' ledgers (default: a temporary folder, removed when the run passes)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.seconds < 90:
        raise SystemExit("boomerang chaos: --seconds must be at least 90")
    if not 1 <= args.agents <= 256:
        raise SystemExit("boomerang chaos: --agents must be 1 to 256")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    folder = args.data_dir or Path(tempfile.mkdtemp(prefix="boomerang-chaos-"))
    # SIGTERM ends the run as Ctrl-C does: everything started is stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        outcome = run(Settings(args.seconds, seed, args.agents, not args.asynchronous, folder))
    except (ChildFailed, PostgresError) as exc:
        print(f"boomerang chaos: {exc}\n(seed {seed}; logs in {folder})", file=sys.stderr)
        return 1
    print(report(outcome), flush=True)
    if outcome.passed and args.data_dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    elif not outcome.passed:
        print(f"logs and ledgers: {folder}")
    return 0 if outcome.passed else 1
