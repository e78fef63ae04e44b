"""`boomerang chaos [--seconds N] [--seed N]`: the randomized fault campaign.

One campaign: start the cluster, let the agents converse, run the seed's faults, check, report.
Timeline of a run of `seconds`: the agents start; after a warm-up the fault window opens and
the plan's faults run in it; after the last fault has ended (its target serves again) the agents
go on for a quiet tail in which reuse must come back; then they stop, the routers' audit spools
drain, and the invariants are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from boomerang_tools.chaos import invariants
from boomerang_tools.chaos.agents import Agents, Attempt
from boomerang_tools.chaos.cluster import Cluster
from boomerang_tools.chaos.faults import Fault, Injector, Ran, plan
from boomerang_tools.chaos.invariants import Check
from boomerang_tools.stack.children import ChildFailed
from boomerang_tools.stack.postgres import PostgresError

WARM_UP_SECONDS = 15.0
QUIET_SECONDS = 20.0
DRAIN_SECONDS = 30.0


@dataclass
class Settings:
    """What to run."""

    seconds: float
    seed: int
    agents: int = 64
    synchronous: bool = True
    folder: Path = Path(".boomerang/chaos")


@dataclass
class Outcome:
    """What a campaign found."""

    settings: Settings
    faults: list[Fault]
    ran: list[Ran] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    lease_states: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every invariant held."""
        return bool(self.checks) and all(c.ok for c in self.checks)


def run(settings: Settings) -> Outcome:
    """The whole campaign (blocking); the cluster is stopped however it ends."""
    cluster = Cluster(settings.folder, settings.synchronous)
    # The seconds in which faults start.
    window = max(10.0, settings.seconds - WARM_UP_SECONDS - QUIET_SECONDS - 30.0)
    outcome = Outcome(settings, plan(settings.seed, window, sorted(cluster.procs)))
    print(f"chaos: seed {settings.seed}, {settings.agents} agents, {settings.seconds:.0f}s, "
          f"{'synchronous' if settings.synchronous else 'asynchronous'} replication; starting in {settings.folder}")
    try:
        cluster.start()
        print(f"chaos: up ({cluster.ha.where}); {len(outcome.faults)} faults planned")
        asyncio.run(_campaign(cluster, settings, outcome))
    finally:
        print("chaos: stopping")
        cluster.stop()
    return outcome


async def _campaign(cluster: Cluster, settings: Settings, outcome: Outcome) -> None:
    agents = Agents([f"http://{g.address}" for g in cluster.gateways], settings.agents, settings.seed)
    talking = asyncio.create_task(agents.run())
    started = time.monotonic()
    injector = Injector(cluster)
    try:
        await asyncio.sleep(WARM_UP_SECONDS)
        print("chaos: faults begin")
        await injector.run(outcome.faults)
        print(f"chaos: last fault ended {time.monotonic() - started:.0f}s in; quiet tail")
        await asyncio.sleep(max(QUIET_SECONDS, settings.seconds - (time.monotonic() - started)))
    finally:
        agents.stop.set()
        await talking
    outcome.ran, outcome.attempts = injector.ran, agents.attempts
    await asyncio.sleep(2)  # the last reports land
    try:
        await _check(cluster, outcome)
    except Exception as exc:  # noqa: BLE001 - the report still prints, the campaign fails
        outcome.checks.append(Check("the checks could run", 1, False, repr(exc)[:300]))


async def _check(cluster: Cluster, outcome: Outcome) -> None:
    attempts, ran = outcome.attempts, outcome.ran
    ledger = invariants.read_ledgers(cluster.ledger(p) for p in cluster.procs.values() if p.kind == "sim")
    served = [a for a in attempts if a.ok]
    failed, explained = invariants.failed_requests(attempts, ran, {g.name: f"http://{g.address}" for g in cluster.gateways})
    engine_doubles = invariants.double_claims_at_engines(ledger)
    corrupt = [e for e in ledger if e.get("outcome") == "corrupt"]
    freed = [e for e in ledger if str(e.get("outcome", "")).startswith("garbage_")]
    back = invariants.reuse_back(attempts, ran)
    # What the clients and the engines saw first: it is reported even if Postgres cannot be asked.
    outcome.checks = [
        Check("requests failed", len(failed), not failed, f"{explained} more cut by a killed gateway or engine, retried"),
        Check("leases claimed twice (engines)", len(engine_doubles), not engine_doubles),
        Check("corrupt pulls or loads", len(corrupt), not corrupt),
        Check("reads of released or freed blocks", len(freed), not freed),
        Check("seconds until reuse came back after the last fault", round(back, 1),
              back <= invariants.REUSE_BACK_SECONDS, f"at most {invariants.REUSE_BACK_SECONDS:.0f}"),
    ]
    outcome.examples = ([f"failed: {a.gateway} {a.conversation} turn {a.turn}: {a.status} {a.error[:160]}" for a in failed[:5]]
                        + engine_doubles[:3] + [f"corrupt: {e}" for e in corrupt[:3]]
                        + [f"freed read: {e}" for e in freed[:3]])
    gateway_logs = "\n".join(p.child.log_path.read_text(errors="replace") for p in cluster.gateways if p.child)
    acked = invariants.acknowledged(served, ledger, gateway_logs)
    await asyncio.to_thread(cluster.ha.wait_primary, 120)
    # The routers write spooled plans once Postgres takes them again: wait for them, bounded.
    deadline = time.monotonic() + DRAIN_SECONDS
    while True:
        db = await invariants.database_checks(cluster.database_url, served, acked)
        if not db["plans_missing"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    outcome.lease_states = db["lease_states"]
    lost = db["registrations_lost"] + db["invalidated_without_reason"]
    outcome.checks += [
        Check("leases claimed twice (audit trail)", len(db["double_claims"]), not db["double_claims"]),
        Check("acknowledged registrations lost", len(lost), not lost, f"of {len(acked)} acknowledged"),
        Check("served turns without their plan in the audit trail", len(db["plans_missing"]), not db["plans_missing"],
              f"of {sum(1 for a in served if a.plan_id)} planned"),
    ]
    outcome.examples += (db["double_claims"][:3] + [f"lost registration: {r}" for r in lost[:3]]
                         + [f"plan missing: {p}" for p in db["plans_missing"][:3]])


def report(outcome: Outcome) -> str:
    """The campaign's printed report: seed, faults as they ran, traffic, and each invariant."""
    s = outcome.settings
    lines = [(f"chaos campaign: seed {s.seed} ({s.seconds:.0f}s, {s.agents} agents, "
             f"{'synchronous' if s.synchronous else 'asynchronous'} replication)"),
             f"rerun: boomerang chaos --seed {s.seed} --seconds {s.seconds:.0f} --agents {s.agents}"
             + ("" if s.synchronous else " --asynchronous"), "", "faults:"]
    opened = min((r.started for r in outcome.ran), default=0.0)
    for r in sorted(outcome.ran, key=lambda r: r.fault.at):
        took = f"ran {r.started - opened:6.1f}s to {r.ended - opened:6.1f}s"
        lines.append(f"  {r.fault.describe()}  {took}{'  ' + r.note if r.note else ''}")
    served = [a for a in outcome.attempts if a.ok]
    plans = Counter(a.plan or "none" for a in served)
    lines += ["", f"turns: {len(served)} served of {len(outcome.attempts)} attempts; plans "
              + ", ".join(f"{k} {v}" for k, v in sorted(plans.items())),
              "leases by state: " + ", ".join(f"{k} {v}" for k, v in sorted(outcome.lease_states.items())), "",
              "invariants:"]
    for c in outcome.checks:
        lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.count:g}{'  (' + c.detail + ')' if c.detail else ''}")
    if outcome.examples:
        lines += ["", "examples:"] + [f"  {e}" for e in outcome.examples]
    lines += ["", f"chaos: {'PASSED' if outcome.passed else 'FAILED'} (seed {s.seed})"]
    return "\n".join(lines)


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
