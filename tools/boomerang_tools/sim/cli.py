"""`boomerang sim`: a simulated vLLM engine (prefill or decode) for tests, demos and laptops.

Running one: binds the API port and the side-channel port (0 picks free ones), then prints
`BOOMERANG_SIM engine_id=… role=… side_channel=HOST:PORT generation=N` and
`BOOMERANG_READY sim-<role> HOST:PORT` once it accepts connections. SIGTERM/SIGINT stop
accepting and give open requests `grace_seconds` to finish.

With a registry address the engine registers itself (RegisterEngine) and heartbeats; after
`POST /sim/restart` it registers its new generation at once, which makes the registry
invalidate the old generation's leases. Registry trouble is logged and retried; it never
stops the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import time
import uuid
from collections.abc import Generator

import uvicorn
import xxhash
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.telemetry import asgi_app, setup_tracing
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.config import run_async
from boomerang_server.sockets import listen_socket
from boomerang_vllm_hook.sender import EngineFacts

from boomerang_tools.sim.app import make_app
from boomerang_tools.sim.costmodel import Link, profile
from boomerang_tools.sim.engine import Engine, SimConfig
from boomerang_tools.sim.hooked import HookOptions, SimHook

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `sim` subcommand."""
    parser = subparsers.add_parser(
        "sim",
        help="run a simulated vLLM engine (NixlConnector, bidirectional KV transfer)",
        description="A simulated vLLM 0.33 OpenAI server with the NixlConnector and bidirectional_kv_xfer "
        "(see tools/boomerang_tools/sim/README.md).",
    )
    parser.add_argument("--role", choices=["prefill", "decode"], required=True, help="prefill (P) or decode (D)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP API port (0: a free one; default 8000)")
    parser.add_argument("--profile", default="qwen3-32b",
                        help="cost profile: qwen3-32b or glm-5-fp8 (fit to AWS's table), qwen3-32b-h200 or "
                        "qwen3-8b-h200 (fit to one H200's measurements); default qwen3-32b")
    parser.add_argument("--link", action="append", default=[], metavar="[ENGINE_ID=]GBPS[:FIXED_MS]",
                        help="the link this engine pulls retained KV over: a rate in GB/s and a fixed cost per pull "
                        "in ms; with ENGINE_ID= only from that decode engine (repeatable; default the profile's: "
                        "55 GB/s and 0 ms for the h200 profiles)")
    parser.add_argument("--ttl", type=float, default=480.0, help="decoder_kv_blocks_ttl in seconds (default 480)")
    parser.add_argument("--engine-id", help="engine id (default sim-<role>-<random>)")
    parser.add_argument("--host", default="127.0.0.1", help="listen host, also the side-channel host (default 127.0.0.1)")
    parser.add_argument("--side-channel-port", type=int,
                        help="simulated NIXL side-channel port (default port+1000, or a free one when --port is 0)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--recompute-threshold", type=int, default=64, help="kv_recompute_threshold in tokens (default 64)")
    parser.add_argument("--strip-reasoning", action="store_true",
                        help="a Qwen3 thinking model: replies start with <think>…</think>, which the chat template "
                        "strips from assistant turns before the last user message")
    parser.add_argument("--generation", type=int,
                        help="initial registration generation (default: the start time in Unix milliseconds, so a "
                        "restarted process always registers a newer generation than its previous run)")
    parser.add_argument("--registry", help="block-registry HOST:PORT to register with and heartbeat (optional)")
    parser.add_argument("--heartbeat-seconds", type=float, default=2.0, help="registry heartbeat interval (default 2)")
    parser.add_argument("--hook", action="store_true",
                        help="run Boomerang's vLLM hook inside the engine (boomerang_vllm_hook, as BoomerangConnector "
                        "does): decode registers its own retained blocks with --registry, prefill plans from its own "
                        "token ids with --router; the hook's sender registers and heartbeats the engine")
    parser.add_argument("--router", help="router HOST:PORT the prefill hook plans with (with --hook)")
    parser.add_argument("--tenant", default="anonymous",
                        help="the hook's tenant for requests that name none (default anonymous; requests may name "
                        "theirs: the gateway in front sets it)")
    parser.add_argument("--plan-deadline-ms", type=float, default=20.0,
                        help="the prefill hook's planning budget, ms (plan_deadline_ms, default 20)")
    parser.add_argument("--plan-wait-share", type=float, default=0.25,
                        help="the share of the prefill time a pull could save that a request waits for its plan "
                        "(plan_wait_share, default 0.25; a pull is valued at the profile's prefill cost per token)")
    parser.add_argument("--prefill-ms-per-token", type=float,
                        help="what the prefill hook values one pulled token at, ms (prefill_ms_per_token; default "
                        "the profile's prefill cost per token): a test that is about what plans do sets it high, so "
                        "a busy host's slow plan is still waited for, up to --plan-deadline-ms")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every simulated latency by this (default 1.0; tests use ~0.01)")
    parser.add_argument("--expiry-margin", type=float, default=5.0,
                        help="P declines a pull this close to D's expiry, seconds (default 5, vLLM's)")
    parser.add_argument("--prefill-hold-seconds", type=float, default=480.0,
                        help="P frees blocks D never read after this long (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, default 480)")
    parser.add_argument("--num-gpu-blocks", type=int, default=1_000_000, help="KV blocks in the simulated pool")
    parser.add_argument("--clock-offset", type=float,
                        help="seconds added to perf_counter for this engine's clock (default: derived from the engine id)")
    parser.add_argument("--served-model-name", help="model name clients use (default: the profile's)")
    parser.add_argument("--max-model-len", type=int, help="context limit in tokens (default: the profile's)")
    parser.add_argument("--grace-seconds", type=float, default=5.0, help="drain time on SIGTERM (default 5)")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="as vLLM's flag: usage carries prompt_tokens_details.cached_tokens")
    parser.add_argument("--prefix-cache-blocks", type=int, default=0,
                        help="prefix caching on this engine (vLLM's --enable-prefix-caching) with room for this many "
                        "blocks, evicted least recently used; default 0: off, as in AWS's tests")
    parser.add_argument("--ledger", metavar="FILE",
                        help="append every pull, load and retained turn to FILE as a JSON line, written as it happens "
                        "(a fault campaign reads what an engine saw even after the engine was killed)")
    parser.add_argument("--log-level", help="logging level (default INFO)")
    parser.set_defaults(handler=_run)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SystemExit(f"boomerang sim: {message}")


def parse_link(spec: str) -> tuple[str, Link]:
    """`[ENGINE_ID=]GBPS[:FIXED_MS]` as (engine id or "", Link); ValueError when malformed."""
    engine_id, _, rate = spec.rpartition("=")
    gbps, _, fixed = rate.partition(":")
    try:
        return engine_id, Link(float(gbps), float(fixed or 0.0))
    except ValueError:
        raise ValueError(f"{spec!r}: want [ENGINE_ID=]GBPS[:FIXED_MS] with GBPS > 0 and FIXED_MS >= 0") from None


def _run(args: argparse.Namespace) -> int:
    try:
        prof = profile(args.profile)
    except ValueError as exc:
        raise SystemExit(f"boomerang sim: --profile: {exc}") from None
    _check(args.host in ("127.0.0.1", "localhost"), "--host must be 127.0.0.1 or localhost")
    _check(0 <= args.port <= 65535, "--port must be 0 to 65535")
    _check(args.ttl > 0, "--ttl must be positive")
    _check(1 <= args.block_size <= 1024, "--block-size must be 1 to 1024")
    _check(args.recompute_threshold >= 0, "--recompute-threshold must be non-negative")
    generation = int(time.time() * 1000) if args.generation is None else args.generation
    _check(generation >= 0, "--generation must be non-negative")
    _check(args.time_scale >= 0, "--time-scale must be non-negative")
    _check(args.num_gpu_blocks >= 1, "--num-gpu-blocks must be positive")
    _check(args.prefix_cache_blocks >= 0, "--prefix-cache-blocks must be non-negative")
    try:
        links = [parse_link(spec) for spec in args.link]
    except ValueError as exc:
        raise SystemExit(f"boomerang sim: --link {exc}") from None
    defaults = [link for engine, link in links if not engine]
    _check(len(defaults) <= 1, "--link without ENGINE_ID= may be given once")
    hook = None
    if args.hook:
        _check(args.role == "prefill" or bool(args.registry), "--hook on a decode engine needs --registry")
        _check(args.role == "decode" or bool(args.router), "--hook on a prefill engine needs --router")
        _check(0 < args.plan_deadline_ms <= 1000, "--plan-deadline-ms must be in (0, 1000]")
        _check(0 <= args.plan_wait_share <= 1, "--plan-wait-share must be in [0, 1]")
        _check(args.prefill_ms_per_token is None or args.prefill_ms_per_token > 0,
               "--prefill-ms-per-token must be positive")
        hook = HookOptions(registry=args.registry or "", router=args.router or "", tenant=args.tenant,
                           plan_deadline_ms=args.plan_deadline_ms, plan_wait_share=args.plan_wait_share,
                           heartbeat_interval_seconds=args.heartbeat_seconds,
                           prefill_ms_per_token=args.prefill_ms_per_token)
    side = args.side_channel_port
    if side is None:
        side = args.port + 1000 if args.port and args.port + 1000 <= 65535 else 0
    engine_id = args.engine_id or f"sim-{args.role}-{uuid.uuid4().hex[:8]}"
    # perf_counter is shared by every process on a host; give each engine its own clock.
    offset = args.clock_offset
    if offset is None:
        offset = 1000.0 + xxhash.xxh3_64_intdigest(engine_id.encode()) % 1_000_000
    config = SimConfig(
        role=args.role,
        engine_id=engine_id,
        profile=prof,
        host="127.0.0.1" if args.host == "localhost" else args.host,
        side_channel_port=side,
        ttl_seconds=args.ttl,
        block_size=args.block_size,
        recompute_threshold=args.recompute_threshold,
        strip_reasoning=args.strip_reasoning,
        time_scale=args.time_scale,
        expiry_margin_seconds=args.expiry_margin,
        prefill_hold_seconds=args.prefill_hold_seconds,
        num_gpu_blocks=args.num_gpu_blocks,
        clock_offset=offset,
        served_model_name=args.served_model_name or prof.served_model_name,
        max_model_len=args.max_model_len or prof.max_model_len,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        prefix_cache_blocks=args.prefix_cache_blocks,
        link=defaults[0] if defaults else None,
        links=tuple((engine, link) for engine, link in links if engine),
        ledger=args.ledger or "",
    )
    run_async(run(config, args.port, generation, args.registry, args.heartbeat_seconds, args.grace_seconds, hook))
    return 0


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture (this module handles SIGTERM/SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _engine_proto(engine: Engine, api_port: int) -> tpb.Engine:
    """The Engine message, as the vLLM hook's registration builds it, with the KV size."""
    cfg = engine.config
    facts = EngineFacts(
        engine_id=cfg.engine_id, role="prefill" if cfg.role == "prefill" else "decode",
        model=cfg.served_model_name, block_size=cfg.block_size,
        kv_blocks_ttl_seconds=max(1, round(cfg.ttl_seconds)), kv_recompute_threshold=cfg.recompute_threshold,
        side_channel_host=cfg.host, side_channel_port=cfg.side_channel_port,
        http_base_url=f"http://{cfg.host}:{api_port}", tp_size=cfg.tp_size)
    proto = facts.engine_proto(engine.generation)
    proto.bytes_per_block = cfg.profile.bytes_per_token * cfg.block_size
    return proto


async def registry_loop(engine: Engine, target: str, api_port: int, interval: float) -> None:
    """Register, then heartbeat every `interval` seconds; re-register on restart or refusal."""
    client = RegistryClient(target, timeout=min(5.0, max(1.0, interval)))
    registered: int | None = None
    try:
        while True:
            try:
                if registered != engine.generation:
                    generation = engine.generation
                    await client.register_engine(rpb.RegisterEngineRequest(
                        engine=_engine_proto(engine, api_port), request_id=str(uuid.uuid4())))
                    registered = generation
                    log.info("registered %s generation %d with %s", engine.config.engine_id, generation, target)
                else:
                    await client.heartbeat(rpb.HeartbeatRequest(
                        engine_id=engine.config.engine_id, registration_generation=engine.generation,
                        in_flight_requests=engine.in_flight, queued_prompt_tokens=engine.queued_prompt_tokens))
            except BoomerangClientError as exc:
                registered = None
                if exc.reason == "STALE_GENERATION":
                    await _adopt_newer_generation(client, engine)
                log.warning("registry %s: %s", target, exc)
            except Exception as exc:  # noqa: BLE001 - the engine must outlive any registry failure
                registered = None
                log.warning("registry %s: %r", target, exc)
            engine.restarted.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(engine.restarted.wait(), timeout=interval)
    finally:
        await client.close()


async def _adopt_newer_generation(client: RegistryClient, engine: Engine) -> None:
    """The registry knows a newer generation of this engine id: move past it (a restart).

    Needs ListEngines, which an `engine:` principal may not call; then the operator must
    restart the simulator with a larger `--generation`.
    """
    try:
        listed = await client.list_engines(rpb.ListEnginesRequest())
    except BoomerangClientError as exc:
        log.error("engine %s: the registry holds a newer generation and ListEngines failed (%s); "
                  "restart with a larger --generation", engine.config.engine_id, exc.code)
        return
    for e in listed.engines:
        if e.engine_id == engine.config.engine_id and e.registration_generation >= engine.generation:
            log.warning("registry has generation %d of %s; restarting as %d", e.registration_generation,
                        e.engine_id, e.registration_generation + 1)
            engine.restart(e.registration_generation + 1)


async def run(
    config: SimConfig,
    port: int,
    generation: int,
    registry: str | None = None,
    heartbeat_seconds: float = 2.0,
    grace_seconds: float = 5.0,
    hook: HookOptions | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (with `hook`, Boomerang's vLLM hook runs inside the engine)."""
    setup_tracing(f"boomerang-sim-{config.role}")  # off unless OTEL_* ask; continues the gateway's trace
    api_sock = listen_socket(f"{config.host}:{port}", "sim", 1024)
    side_sock = listen_socket(f"{config.host}:{config.side_channel_port}", "sim", 1024)
    api_port, side_port = api_sock.getsockname()[1], side_sock.getsockname()[1]
    cfg = dataclasses.replace(config, side_channel_port=side_port)
    engine = Engine(cfg, generation)
    app = asgi_app(make_app(engine, {"side": side_port}))
    server = _Server(uvicorn.Config(
        app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=max(1, round(grace_seconds)),
        timeout_keep_alive=30))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    serving = asyncio.ensure_future(server.serve(sockets=[api_sock, side_sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if serving.done():
        serving.result()
        return
    side = f"{cfg.host}:{side_port}"
    print(f"BOOMERANG_SIM engine_id={cfg.engine_id} role={cfg.role} profile={cfg.profile.name} "
          f"model={cfg.served_model_name} side_channel={side} generation={generation}", flush=True)
    print(f"BOOMERANG_READY sim-{cfg.role} {cfg.host}:{api_port}", flush=True)
    sys.stdout.flush()
    if hook is not None:
        # The hook's own sender registers the engine and heartbeats, as inside vLLM.
        engine.hook = SimHook(cfg, hook, f"http://{cfg.host}:{api_port}", generation)
        engine.hook.start()
        registry = None
    heartbeat = asyncio.ensure_future(registry_loop(engine, registry, api_port, heartbeat_seconds)) if registry else None
    try:
        await serving
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        await engine.close()
