"""`boomerang status`: engines, leases, retained memory, the reaper, and recent reuse.

It asks the services only (registry `ListEngines`/`ListLeases`, router `ListEngines`, reaper
`GetStatus`, the gateway's `/metrics`). The reuse figures of the last `--window` seconds are
derived from the leases (the router lists one conversation's plans, not a window's): a turn
that pulled consumed the previous turn's lease, and each retained turn created one. The
gateway's counters add planned against delivered reuse and the misses by reason.

Decode memory: retained blocks say how much decode memory leases hold now; block-seconds say
what holding it cost over the window (a lease's blocks × the part of its life inside the
window, ending when the lease ended: D is told to free an ended lease on its next
heartbeat). Releases by state say why leases ended (read, superseded, expired, invalidated,
released early); the gateway's misses (`LEASE_RELEASED`) count the reuse lost to an early
release.

Reuse outcomes are the gateway's counters since it started (`--gateway`), which also see the
turns the router never planned (`TOKENIZE_FAILED`, `CONTROL_PLANE_DEGRADED`, …). A turn missed
its reuse when the plan reused nothing (its reason: `NO_LEASE`, `PREFIX_MISMATCH`, …) or when
the prefill engine reported fewer tokens than planned (`PREFILL_SHORTFALL`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.reaper import ReaperClient
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.config import TelemetrySettings, load_settings
from boomerang_server.leases import ENDED_STATES, LIVE_STATES
from prometheus_client.parser import text_string_to_metric_families

from boomerang_cli.context import add_source_flags, resolve_sources, service_target
from boomerang_cli.failures import run_against
from boomerang_cli.tables import (
    emit,
    human_bytes,
    human_seconds,
    iso,
    parse_iso,
    percent,
    table,
)

MAX_PAGES = 50  # × 1000 leases per listing; beyond that counts are marked partial
# Why a lease ended, in the order the report lists them.
END_REASONS = ("CONSUMED", "SUPERSEDED", "EXPIRED", "INVALIDATED", "RELEASED")
_GATEWAY = "boomerang_gateway_reuse_"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `status` subcommand."""
    parser = subparsers.add_parser(
        "status",
        help="show engines, leases, retained KV memory, the reaper and recent reuse",
        description="Engines with health, generation and load; live leases by state; retained blocks per "
        "decode engine; the TTL reaper; reuse rate and tokens saved over the last few minutes.",
    )
    add_source_flags(parser)
    parser.add_argument("--window", type=float, default=300.0, help="seconds of recent reuse to summarize (default 300)")
    parser.add_argument("--gateway",
                        help="gateway HOST:PORT or URL whose /metrics give reuse outcomes "
                        "(planned vs delivered, misses by reason; default: $BOOMERANG_GATEWAY_URL, else the "
                        "`boomerang up` context's gateway, else skip)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # Failures go up to `boomerang`'s one place (failures.py), named after whom they were talking to.
    origin = resolve_sources(args, "registry", "router", "reaper", "gateway")
    data = run_against(service_target("registry", args.registry, origin),
                       gather(args.registry, args.router, args.reaper, args.timeout, args.window, args.gateway))
    emit(data, args.json, render)
    return 0


def saved_seconds(tokens: int) -> float:
    """Estimated prefill time `tokens` pulled tokens saved (BOOMERANG_PREFILL_MS_PER_TOKEN)."""
    return tokens * load_settings(TelemetrySettings).prefill_ms_per_token / 1000


def retained_rows(engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decode engines' retained blocks and bytes, by engine id."""
    return [
        {"engine_id": e["engine_id"], "blocks": e["retained_blocks"], "bytes": e["retained_bytes"]}
        for e in sorted(engines, key=lambda e: e["engine_id"])
        if e["role"] == "DECODE"
    ]


# -- figures from the APIs (pure functions over protos, unit-tested) ---------------------------


def _epoch(ts: Any) -> float:
    """A protobuf `Timestamp` in epoch seconds."""
    return float(ts.seconds + ts.nanos / 1e9)


def engine_row(e: Any, now: float) -> dict[str, Any]:
    """One registry `Engine` as the report shows it."""
    heartbeat = _epoch(e.heartbeat_time) if e.HasField("heartbeat_time") else None
    return {
        "engine_id": e.engine_id,
        "role": tpb.EngineRole.Name(e.role).removeprefix("ENGINE_ROLE_"),
        "model": e.model,
        "status": tpb.EngineStatus.Name(e.status).removeprefix("ENGINE_STATUS_"),
        "generation": e.registration_generation,
        "heartbeat_age_seconds": round(max(0.0, now - heartbeat), 3) if heartbeat else None,
        "in_flight_requests": e.in_flight_requests,
        "queued_prompt_tokens": e.queued_prompt_tokens,
        "retained_blocks": e.retained_blocks,
        "retained_bytes": e.retained_blocks * e.bytes_per_block if e.bytes_per_block else None,
        "kv_ttl_seconds": e.kv_blocks_ttl_seconds,
        "http_base_url": e.http_base_url,
    }


def window_from_leases(leases: Iterable[Any], since: float) -> dict[str, Any]:
    """Reuse since `since` (epoch seconds) as the leases tell it.

    Each retained turn created a lease; each turn whose prefill engine pulled consumed the
    previous turn's lease (so CONSUMED leases updated in the window count pulls, and their
    tokens bound the tokens reused from above).
    """
    created = pulled = reused = 0
    ended: dict[str, int] = {s: 0 for s in ENDED_STATES}
    for lease in leases:
        state = tpb.LeaseState.Name(lease.state).removeprefix("LEASE_STATE_")
        if _epoch(lease.create_time) >= since:
            created += 1
        if state in ended and _epoch(lease.update_time) >= since:
            ended[state] += 1
            if state == "CONSUMED":
                pulled += 1
                reused += lease.num_tokens
    return {
        "turns": created,
        "pulled_turns": pulled,
        "reuse_rate": pulled / created if created else None,
        "reused_tokens": reused,
        "ended_leases": ended,
        "source": "leases (turns = leases created, pulls = leases consumed; reused tokens are an upper bound)",
    }


def block_seconds_from_leases(leases: Iterable[Any], since: float, now: float) -> dict[str, float]:
    """Block-seconds per engine held inside [since, now] by these `Lease` messages (each counted once)."""
    seen: set[str] = set()
    out: dict[str, float] = {}
    for lease in leases:
        if lease.lease_id in seen:
            continue
        seen.add(lease.lease_id)
        state = tpb.LeaseState.Name(lease.state).removeprefix("LEASE_STATE_")
        end = now if state in LIVE_STATES else min(now, _epoch(lease.update_time))
        start = max(since, _epoch(lease.create_time))
        blocks = sum(len(g.block_ids) for g in lease.block_groups)
        if end > start and blocks:
            out[lease.engine_id] = out.get(lease.engine_id, 0.0) + blocks * (end - start)
    return out


def memory_section(
    retained: list[dict[str, Any]],
    block_seconds: Mapping[str, float],
    ended: Mapping[str, int],
    window: float,
) -> dict[str, Any]:
    """The report's `memory` part: per decode engine (from `retained_rows`) and leases ended by state."""
    return {
        "window_seconds": window,
        "engines": [
            {"engine_id": r["engine_id"], "retained_blocks": r["blocks"],
             "block_seconds": round(float(block_seconds.get(r["engine_id"], 0.0)), 1)}
            for r in retained
        ],
        "releases_by_reason": {k: int(ended[k]) for k in END_REASONS if ended.get(k)},
    }


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def outcomes_from_metrics(exposition: str) -> dict[str, Any]:
    """The outcomes from a gateway's `/metrics` text (its counters since it started)."""
    values: dict[str, float] = {}
    misses: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        if not family.name.startswith(_GATEWAY):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(_GATEWAY).removesuffix("_total")
            if name == "declined_turns":
                reason = sample.labels.get("reason", "UNSPECIFIED")
                misses[reason] = misses.get(reason, 0) + int(sample.value)
            else:
                values[name] = values.get(name, 0.0) + sample.value
    if "turns" not in values:
        raise ValueError("the gateway's /metrics has no boomerang_gateway_reuse_turns_total (an older gateway?)")
    turns = int(values["turns"])
    reported = turns - int(values.get("unreported_turns", 0))
    planned = int(values.get("planned_tokens", 0))
    delivered = int(values.get("delivered_tokens", 0))
    return {
        "turns": turns,
        "prompt_tokens": int(values.get("prompt_tokens", 0)),
        "planned_tokens": planned,
        "delivered_tokens": delivered,
        "reported_turns": reported,
        # Turns that got the reuse they were planned (and some reuse at all).
        "reuse_rate": _ratio(turns - sum(misses.values()), turns),
        # Delivered over planned, over the turns whose prefill engine reported a count.
        "delivery_rate": _ratio(delivered, planned if reported == turns else 0),
        "misses_by_reason": [{"reason": r, "turns": n} for r, n in sorted(misses.items(), key=lambda x: (-x[1], x[0]))],
        "source": "gateway counters since it started",
    }


async def gateway_outcomes(url: str, timeout: float) -> dict[str, Any]:
    """Fetch and read a gateway's `/metrics`; {"error": …} when it cannot be read."""
    base = url if "://" in url else f"http://{url}"
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            resp = await http.get(base.rstrip("/") + "/metrics")
            resp.raise_for_status()
        out = outcomes_from_metrics(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        return {"address": url, "error": str(exc) or type(exc).__name__}
    out["address"] = url
    return out


async def _scan(registry: Any, req: Any, stop_before: float | None = None) -> tuple[list[Any], bool]:
    """Pages of ListLeases (newest first) until done, past `stop_before`, or MAX_PAGES; (leases, partial)."""
    out: list[Any] = []
    req.page_size = 1000
    for _ in range(MAX_PAGES):
        page = await registry.list_leases(req)
        out.extend(page.leases)
        oldest = page.leases[-1].create_time.seconds if page.leases else None
        if not page.next_page_token or (stop_before is not None and oldest is not None and oldest < stop_before):
            return out, False
        req.page_token = page.next_page_token
    return out, True


async def gather(
    registry: str, router: str, reaper: str, timeout: float, window: float, gateway: str = ""
) -> dict[str, Any]:
    """The report from the services' APIs."""
    now = time.time()
    since = now - window
    async with RegistryClient(registry, timeout=timeout) as reg:
        engines = list((await reg.list_engines(rpb.ListEnginesRequest())).engines)
        live, live_partial = await _scan(
            reg, rpb.ListLeasesRequest(states=[tpb.LEASE_STATE_RETAINED, tpb.LEASE_STATE_CLAIMED])
        )
        # Leases consumed in the window were created at most one TTL before it.
        lookback = max([e.kv_blocks_ttl_seconds for e in engines] + [480])
        recent, recent_partial = await _scan(reg, rpb.ListLeasesRequest(), stop_before=since - lookback)
    counts = {s: 0 for s in LIVE_STATES}
    for lease in live:
        counts[tpb.LeaseState.Name(lease.state).removeprefix("LEASE_STATE_")] += 1
    reuse = window_from_leases(recent, since)
    reuse.update(window_seconds=window, partial=recent_partial,
                 saved_prefill_seconds=round(saved_seconds(reuse["reused_tokens"]), 3))
    data: dict[str, Any] = {
        "generated_at": iso(now),
        "registry": registry,
        "engines": [engine_row(e, now) for e in sorted(engines, key=lambda e: (e.role, e.engine_id))],
        "live_leases": {"by_state": counts, "partial": live_partial},
        "retained": retained_rows([engine_row(e, now) for e in engines]),
        "reuse": reuse,
        "router": None,
        "reaper": None,
    }
    data["memory"] = memory_section(data["retained"], block_seconds_from_leases([*live, *recent], since, now),
                                    reuse["ended_leases"], window)
    if router:
        try:
            async with RouterClient(router, timeout=timeout) as rt:
                pool = await rt.list_engines(rtpb.RouterServiceListEnginesRequest(), timeout=timeout)
            data["router"] = {"address": router, "pool": [_pool_row(p) for p in pool.engines]}
        except BoomerangClientError as exc:
            data["router"] = {"address": router, "error": f"{exc.code}: {exc.error.message}"}
    if reaper:
        try:
            async with ReaperClient(reaper, timeout=timeout) as rp:
                data["reaper"] = _reaper_row(await rp.get_status(timeout=timeout), reaper)
        except BoomerangClientError as exc:
            data["reaper"] = {"address": reaper, "error": f"{exc.code}: {exc.error.message}"}
    if gateway:
        reuse["outcomes"] = await gateway_outcomes(gateway, timeout)
    return data


def _pool_row(p: Any) -> dict[str, Any]:
    c = p.prefill_cost
    bytes_per_token = p.engine.bytes_per_block / p.engine.block_size if p.engine.block_size else 0.0
    return {
        "engine_id": p.engine.engine_id,
        "role": tpb.EngineRole.Name(p.engine.role).removeprefix("ENGINE_ROLE_"),
        "source": rtpb.EngineSource.Name(p.source).removeprefix("ENGINE_SOURCE_"),
        "available": p.available,
        "unavailable_reason": p.unavailable_reason,
        "planned_turns": p.planned_turns,
        "load": round(p.load, 1),
        "prefill_cost": {"floor_ms": c.floor_ms, "token_ms": c.token_ms, "attention_ms": c.attention_ms,
                         "context_ms": c.context_ms, "observations": c.observations},
        "inter_token_ms": p.inter_token_ms,
        "first_step_ms": p.first_step_ms,
        "copy_costs": [{"source_engine_id": x.source_engine_id, "fixed_ms": x.fixed_ms, "token_ms": x.token_ms,
                        "observations": x.observations,
                        # GB/s when the engine says how many bytes a block holds
                        "gb_per_second": round(bytes_per_token / x.token_ms / 1e6, 2)
                        if bytes_per_token and x.token_ms > 0 else None} for x in p.copy_costs],
    }


def _prefill_ms(c: dict[str, Any], n: int) -> float:
    """A learned prefill cost's prediction for a whole prompt of `n` tokens."""
    return float(max(c["floor_ms"], c["token_ms"] * n) + c["attention_ms"] * n * n / 2000)


def _learned_rows(pool: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per engine's prefill cost and per pair's copy cost, as the router learned them."""
    rows: list[list[Any]] = []
    for p in pool:
        c = p["prefill_cost"]
        model = (f"max({c['floor_ms']:.1f} ms, {c['token_ms'] * 1000:.1f} µs/token) "
                 f"+ {c['attention_ms'] * 1000:.2f} µs/token/1k computed "
                 f"+ {c['context_ms'] * 1000:.2f} µs/token/1k held")
        predicted = f"2k: {_prefill_ms(c, 2000):.0f} ms, 24k: {_prefill_ms(c, 24000):.0f} ms"
        rows.append([p["engine_id"], "prefill", model, predicted, c["observations"]])
        for x in p["copy_costs"]:
            rate = "—"
            if x["gb_per_second"]:
                rate = f"{x['gb_per_second']} GB/s"
            elif x["token_ms"] > 0:
                rate = f"{1 / x['token_ms']:.0f} tokens/ms"
            rows.append([f"{x['source_engine_id']} → {p['engine_id']}", "copy",
                         f"{x['fixed_ms']:.1f} ms + {x['token_ms'] * 1000:.2f} µs/token", rate, x["observations"]])
        if p["role"] == "DECODE":
            rows.append([p["engine_id"], "inter-token", f"{p['inter_token_ms']:.1f} ms", "", ""])
            rows.append([p["engine_id"], "first step after a hand-off", f"{p['first_step_ms']:.1f} ms", "", ""])
    return rows


def _reaper_row(s: Any, address: str) -> dict[str, Any]:
    lag = s.expiry_lag
    return {
        "address": address,
        "leader_replica_id": s.leader_replica_id,
        "term": s.term,
        "live_leases": s.live_leases,
        "backlog_leases": s.backlog_leases,
        "next_expire_time": iso(s.next_expire_time),
        "expired_leases": s.expired_leases,
        "invalidated_leases": s.invalidated_leases,
        "expiry_lag": {"count": lag.count, "p50_seconds": lag.p50_seconds, "p99_seconds": lag.p99_seconds,
                       "max_seconds": lag.max_seconds},
    }


# -- rendering ---------------------------------------------------------------------------------


def render(d: dict[str, Any]) -> list[Any]:
    """The report as tables a person reads at a glance."""
    out: list[Any] = []
    r = d["reuse"]
    saved = human_seconds(r.get("saved_prefill_seconds"))
    out.append(table(
        f"Reuse, last {r['window_seconds']:.0f} s",
        ["turns", "pulled", "reuse rate", "tokens reused", "prefill time saved (est.)"],
        [[r["turns"], r["pulled_turns"], percent(r["reuse_rate"]), r["reused_tokens"], saved]],
        caption="from the leases: " + r["source"].split("(", 1)[-1].rstrip(")")
        + (" — partial (too many leases to list)" if r.get("partial") else ""),
    ))
    out.extend(_outcome_tables(r))
    now = parse_iso(d["generated_at"])
    out.append(table(
        "Engines",
        ["engine", "role", "model", "status", "gen", "heartbeat", "in flight", "queued tokens", "retained blocks"],
        [[e["engine_id"], e["role"], e["model"], e["status"], str(e["generation"]),
          "" if e["heartbeat_age_seconds"] is None else human_seconds(e["heartbeat_age_seconds"]) + " ago",
          e["in_flight_requests"], e["queued_prompt_tokens"], e["retained_blocks"]] for e in d["engines"]],
        caption=f"as of {now:%H:%M:%S} UTC" if now else "",
    ))
    live = d["live_leases"]
    ended = r.get("ended_leases", {})
    out.append(table(
        "Leases by state",
        ["state", "leases"],
        [[s, n] for s, n in live["by_state"].items()] + [[f"{s} (last {r['window_seconds']:.0f} s)", n] for s, n in ended.items()],
        caption="partial (too many to list)" if live.get("partial") else "",
    ))
    out.extend(render_memory(d.get("memory")))
    out.append(table(
        "Retained per decode engine",
        ["engine", "blocks", "memory"],
        [[x["engine_id"], x["blocks"], human_bytes(x["bytes"]) if x["bytes"] is not None else "unknown"] for x in d["retained"]],
    ))
    router = d.get("router")
    if router is not None:
        if "error" in router:
            out.append(f"[bold red]router {router['address']}[/]: {router['error']}")
        else:
            out.append(table(
                f"Router pool ({router['address']})",
                ["engine", "role", "source", "available", "planned turns", "load"],
                [[p["engine_id"], p["role"], p["source"], "yes" if p["available"] else f"no: {p['unavailable_reason']}",
                  p["planned_turns"], p["load"]] for p in router["pool"]],
            ))
            out.append(table(
                f"Learned costs ({router['address']})",
                ["engine", "cost", "model", "predicted", "turns learned from"],
                _learned_rows(router["pool"]),
                caption="what the router predicts a turn's time to first token from; 0 turns: the configured default",
            ))
    reaper = d.get("reaper")
    if reaper is not None:
        if "error" in reaper:
            out.append(f"[bold red]reaper {reaper['address']}[/]: {reaper['error']}")
        else:
            lag = reaper["expiry_lag"]
            out.append(table(
                "TTL reaper",
                ["leader", "term", "live", "overdue", "expired", "invalidated", "lag p50", "lag p99", "lag max"],
                [[reaper["leader_replica_id"] or "none", reaper["term"], reaper["live_leases"], reaper["backlog_leases"],
                  reaper["expired_leases"], reaper["invalidated_leases"], human_seconds(lag["p50_seconds"]),
                  human_seconds(lag["p99_seconds"]), human_seconds(lag["max_seconds"])]],
                caption=f"next deadline {reaper['next_expire_time'] or 'none'}",
            ))
    return out


def _outcome_tables(r: dict[str, Any]) -> list[Any]:
    """Planned vs delivered reuse and the misses by reason, when the report has them."""
    o = r.get("outcomes")
    if not o:
        return []
    if "error" in o:
        return [f"[bold red]gateway {o['address']}[/]: {o['error']}"]
    summary = [[o["turns"], percent(o["reuse_rate"]), o["planned_tokens"], o["delivered_tokens"],
                percent(o["delivery_rate"]), f"{o['reported_turns']}/{o['turns']}"]]
    misses = [[m["reason"], m["turns"]] for m in o["misses_by_reason"]]
    return [
        table("Reuse outcomes", ["turns", "reuse rate", "planned tokens", "delivered tokens", "delivered/planned",
                                 "reported"], summary, caption=o["source"]),
        table("Reuse misses by reason", ["reason", "turns"], misses or [["none", 0]]),
    ]


def render_memory(m: dict[str, Any] | None) -> list[Any]:
    """The memory tables, when the report has them."""
    if not m:
        return []
    window = f"last {m['window_seconds']:.0f} s"
    return [
        table(f"Decode memory held, {window}", ["engine", "retained blocks", "block-seconds"],
              [[e["engine_id"], e["retained_blocks"], f"{e['block_seconds']:,.0f}"] for e in m["engines"]],
              caption="leases' blocks × their life in the window (from the leases listed)"),
        table(f"Releases by reason, {window}", ["reason", "leases"],
              [[k, n] for k, n in m["releases_by_reason"].items()] or [["none", 0]],
              caption="reuse lost to an early release: the gateway's misses (LEASE_RELEASED)"),
    ]
