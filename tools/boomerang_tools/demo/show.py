"""What the demo shows on the terminal: a progress bar while it runs, then the results, and
one conversation's audit trail read back from the services.

The trail is `boomerang audit`'s (boomerang_cli.audit reads it over gRPC from the demo's
running services, audit_report.build merges it): the router's plans (ListTurnPlans) say what
was decided for each turn and why, the registry's lease events (GetConversation) what
happened to each retained turn's blocks; merged by time they tell the story of a
conversation (registered, claimed by the next turn's plan, consumed by the pull, superseded
by the next turn's blocks), shown here as a compact table.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from boomerang_cli.audit import gather_api
from boomerang_cli.tables import parse_iso
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boomerang_tools.demo import report, skeptic
from boomerang_tools.demo.modes import Mode
from boomerang_tools.demo.runner import RunResult, run_profile, run_rotation, turns_per_profile
from boomerang_tools.demo.workload import QUICK_POINTS

# Which service each kind of timeline line comes from.
_SOURCE = {"PLAN": "router", "REPORT": "router", "LEASE": "registry"}


@dataclass(frozen=True)
class Entry:
    """One line of the trail."""

    at: datetime
    source: str  # "router" or "registry"
    what: str
    detail: str


async def trail(registry: str, router: str, tenant: str, conversation_id: str, timeout: float = 5.0) -> list[Entry]:
    """Plans, their reports and lease events of a conversation, in time order (registry and router: addresses)."""
    gathered = await gather_api(registry, router, conversation_id, tenant, timeout)
    out: list[Entry] = []
    for line in gathered["timeline"]:
        at = parse_iso(line["time"])
        if at is not None:
            turn = f"turn {line['turn']}: " if line["turn"] else ""
            out.append(Entry(at, _SOURCE[line["kind"]], turn + line["what"], line["detail"]))
    return out


def render(entries: list[Entry], conversation_id: str, limit: int = 16) -> Table:
    """The trail as a table (the first `limit` entries, then a count of the rest)."""
    t = Table(title=f"Audit trail of conversation {conversation_id!r}, from the router's ListTurnPlans and the "
              "registry's GetConversation", title_justify="left", header_style="bold")
    t.add_column("t", justify="right")
    t.add_column("from", no_wrap=True)
    t.add_column("what")
    t.add_column("detail", overflow="fold")
    start = entries[0].at if entries else None
    for entry in entries[:limit]:
        assert start is not None
        t.add_row(f"+{(entry.at - start).total_seconds():.2f}s", entry.source, entry.what, entry.detail)
    if len(entries) > limit:
        plans = sum(1 for e in entries if e.source == "router")
        t.caption = (f"… {len(entries) - limit} more ({plans} plan lines and {len(entries) - plans} "
                     "lease events in all; `boomerang audit` shows every one)")
    return t


def measure(
    console: Console,
    gateway_url: str,
    profiles: list[str],
    points: dict[str, tuple[int, ...]],
    reps: int,
    models: dict[str, str],
    result: RunResult,
    mode: Mode,
    rotations: list[tuple[str, int, tuple[int, ...]]] | None = None,
) -> RunResult:
    """Run every profile's conversations in one deployment (one profile after the other)
    under a progress bar, adding to `result` (Boomerang off in the baseline's, else on);
    then each (profile, conversations, points) of `rotations`: that many conversations
    sharing the engines, their turns in rotation."""
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TextColumn("turns"),
               TimeElapsedColumn())
    what = "off" if mode.baseline else "on"
    with Progress(*columns, console=console) as progress:
        tasks = {p: progress.add_task(f"{models[p]} {what} ({mode.label}) ×{reps}",
                                      total=turns_per_profile(points[p], reps))
                 for p in profiles}
        spins = [(p, n, pts, progress.add_task(f"{models[p]} {n} conversations ({mode.label})",
                                               total=turns_per_profile(pts, n)))
                 for p, n, pts in rotations or []]

        async def main() -> None:
            for p in profiles:
                await run_profile(gateway_url, p, models[p], points[p], reps, result,
                                  lambda p=p: progress.advance(tasks[p]), mode.name, what,  # type: ignore[misc]
                                  mode.conversation_id)
            for p, n, pts, task in spins:
                await run_rotation(gateway_url, p, models[p], pts, n, result,
                                   lambda task=task: progress.advance(task), mode.name,  # type: ignore[misc]
                                   mode.conversation_id)

        asyncio.run(main())
    return result


def _plans(result: RunResult, deployments: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in result.records:
        if r.mode == "on" and r.result.ok and r.deployment in deployments:
            counts[r.result.plan or "?"] = counts.get(r.result.plan or "?", 0) + 1
    return counts


def _skeptic(
    console: Console,
    result: RunResult,
    profiles: list[str],
    points: dict[str, tuple[int, ...]],
    modes: list[Mode],
    extra: dict[tuple[str, str], dict[str, Any]],
    rotations: list[tuple[str, str, int, tuple[int, ...]]],
) -> tuple[list[str], dict[str, Callable[[Any], list[tuple[float, float, str, str]]]]]:
    """The alternative to Boomerang beside it, by conversations sharing the prefill engine: a
    table per profile, its report rows (in `extra`), the verdict lines and the chart panels."""
    boomerang = next((m for m in modes if m.boomerang), None)
    verdicts: list[str] = []
    lower: dict[str, Callable[[Any], list[tuple[float, float, str, str]]]] = {}
    for mode in (m for m in modes if not m.boomerang):
        for p in (q for q in profiles if (q, mode.name) in extra):
            info = extra[(p, mode.name)]
            capacity = int(info.get("prefix_cache_capacity_tokens", 0))
            level_one = tuple(c for c in points[p] if c in QUICK_POINTS[p]) or points[p]
            measured = skeptic.levels(p, level_one, [(q, n, pts) for m, q, n, pts in rotations if m == mode.name])
            entry = skeptic.report_entry(result, p, mode, boomerang, measured)
            info["concurrency"] = entry
            console.print()
            console.print(skeptic.table(p, entry, boomerang, capacity))
            verdicts += skeptic.verdict(p, entry)
            lower[p] = functools.partial(skeptic.panel, profile=p, entry=entry, boomerang=boomerang,
                                         capacity_tokens=capacity)
    return verdicts, lower


def _off(result: RunResult, profiles: list[str], extra: dict[tuple[str, str], dict[str, Any]]) -> dict[str, int]:
    """What the baseline's turns computed: off recomputes every prompt, so its engines pull
    nothing and its turns report no cached prompt token."""
    turns = [r for r in result.records if r.mode == "off"]
    return {"turns": len(turns), "cached_tokens": sum(r.result.cached_tokens for r in turns if r.result.ok),
            "pulls": sum(extra.get((p, "off"), {}).get("pulls", 0) for p in profiles)}


def conclude(
    console: Console,
    result: RunResult,
    stats: dict[str, int],
    profiles: list[str],
    points: dict[str, tuple[int, ...]],
    out_dir: Path,
    services: tuple[str, str],
    started: float,
    modes: list[Mode],
    extra: dict[tuple[str, str], dict[str, Any]],
    rotations: list[tuple[str, str, int, tuple[int, ...]]] | None = None,
) -> int:
    """Print the tables, write the report and chart, show an audit trail (read over gRPC from
    `services`, the running registry's and router's addresses); the exit code.

    `stats` sums every simulated engine's counters over every mode; `extra` holds each
    (profile, mode)'s own figures for the report (its engines' /tokenize calls, …);
    `rotations` the (mode, profile, conversations, contexts) measured with many conversations."""
    # An alternative to Boomerang may have run on fewer profiles (--quick): no empty entries.
    tables: list[report.Measured] = [
        (p, {m.name: report.rows(result, p, points[p], m.name, m.boomerang) for m in modes if m.boomerang or (p, m.name) in extra})
        for p in profiles]
    for name, by_mode in tables:
        console.print()
        pulled = {m.name: {p: result.probe_plans(name, p, m.name) for p in points[name]} for m in modes}
        console.print(report.table(name, by_mode, [m for m in modes if m.name in by_mode], pulled))
    verdicts, lower = _skeptic(console, result, profiles, points, modes, extra, rotations or [])
    corrupt = stats["corrupt_pulls"] + stats["expired_or_freed_reads"] + stats["corrupt_loads"] + stats["expired_or_freed_loads"]
    failed = len(result.failed)
    off = _off(result, profiles, extra)
    data: dict[str, Any] = report.report(tables, corrupt, failed, off, extra)
    data["first_turn_delta_ms"] = {m.name: {p: round(v, 2) for p in profiles
                                            if (v := result.first_turn_delta_ms(p, m.name)) is not None}
                                   for m in modes if m.boomerang}
    json_path, png_path = out_dir / "demo-report.json", out_dir / "demo-report.png"
    report.write_json(data, json_path)
    report.chart(tables, modes, png_path, lower)
    first = profiles[0]
    cid = result.conversation_ids.get((first, 0), "")
    if cid and all(services):
        try:
            entries = asyncio.run(trail(*services, "anonymous", cid))
            console.print()
            console.print(render(entries, cid))
        except Exception as exc:  # noqa: BLE001 - the audit view is a bonus, never the verdict
            console.print(f"[yellow]audit trail unavailable: {exc}[/yellow]")
    plans = _plans(result, {m.name for m in modes if m.boomerang})
    mismatched = result.mismatched_replies()
    console.print()
    spent = [f"{p} {points[p][-1] // 1000}k: {ms:.0f} ms" for p in profiles
             if (ms := result.overhead_ms(p, points[p][-1], "gateway")) is not None]
    if spent:
        console.print("Boomerang's own share of a turn's TTFT with the gateway planning (tokenize + plan), at the "
                      f"longest context: {', '.join(spent)}.")
    firsts = "; ".join(f"{mode}: " + ", ".join(f"{p} {v:+.1f} ms" for p, v in by_profile.items())
                       for mode, by_profile in data["first_turn_delta_ms"].items() if by_profile)
    if firsts:
        console.print(f"A first turn (nothing to pull), TTFT with Boomerang on less off, median: {firsts}.")
    for m in modes:
        calls = sum(extra.get((p, m.name), {}).get("tokenize_calls", 0) for p in profiles)
        planned = [f"{p}: {v:.1f} ms" for p in profiles
                   if (v := extra.get((p, m.name), {}).get("engine_plan_ms_p50")) is not None]
        in_loop = sum(extra.get((p, m.name), {}).get("engine_loop_in_boomerang_ms", 0.0) for p in profiles)
        longest = max((extra.get((p, m.name), {}).get("engine_loop_longest_call_ms", 0.0) for p in profiles), default=0.0)
        console.print(f"{m.label}: {calls:,} /tokenize call(s) on the engines"
                      + (f"; the prefill engine's own plan, p50 (inside its TTFT): {', '.join(planned)}" if planned else "")
                      + f"; the engines' scheduler loops spent {in_loop:.1f} ms in Boomerang's hook in all (longest call "
                      f"{longest:.2f} ms) and waited on the network for none of it.")
    console.print(
        f"Boomerang on: {', '.join(f'{v} {k}' for k, v in sorted(plans.items()))} turns; "
        f"{stats['pulls']:,} pulls moved {stats['pulled_tokens']:,} tokens instead of recomputing them."
    )
    for mode, t in data["ceiling_targets"].items():
        below = ", ".join(f"{k} {v:.0%}" for k, v in t["below"].items())
        console.print(f"{mode}: at the reference's points (AWS's published, the H200's measured), at least {t['lowest']:.0%} of the simulator's own ceiling "
                      f"speedup (target ≥ {t['target']:.0%}): " + ("met" if t["met"] else f"not met ({below})"))
    for line in verdicts:
        console.print(line)
    console.print(f"Wrote {json_path} and {png_path} in {time.monotonic() - started:.0f}s.")
    problems = []
    if failed:
        problems.append(f"{failed} failed request(s): " + "; ".join(r.result.error[:120] for r in result.failed[:3]))
    if corrupt:
        problems.append(f"{corrupt} corrupt pull(s) (KV that did not match the prompt, or expired/freed blocks)")
    if mismatched:
        problems.append(f"{mismatched} reply(ies) differ between Boomerang off and on")
    if off["cached_tokens"] or off["pulls"]:
        problems.append(f"Boomerang off did not recompute every prompt: {off['pulls']} pull(s), "
                        f"{off['cached_tokens']:,} prompt token(s) not computed in {off['turns']} turns")
    if problems:
        for problem in problems:
            console.print(f"[bold red]FAIL[/bold red] {problem}")
        return 1
    console.print("[bold green]OK[/bold green] 0 failed requests, 0 corrupt pulls, identical replies off and on.")
    return 0
