"""Running a simulated engine: sockets, uvicorn, optional registry registration, drain.

Binds the API port and the side-channel port (0 picks free ones), then prints
`BOOMERANG_SIM engine_id=… role=… side_channel=HOST:PORT generation=N` and
`BOOMERANG_READY sim-<role> HOST:PORT` once it accepts connections. SIGTERM/SIGINT stop
accepting and give open requests `grace_seconds` to finish.

With a registry address the engine registers itself (RegisterEngine) and heartbeats; after
`POST /sim/restart` it registers its new generation at once, which makes the registry
invalidate the old generation's leases. Registry trouble is logged and retried; it never
stops the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import uuid
from collections.abc import Generator

import uvicorn
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.telemetry import asgi_app, setup_tracing
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.sockets import listen_socket

from boomerang_tools.sim.app import make_app
from boomerang_tools.sim.engine import Engine, SimConfig
from boomerang_tools.sim.hooked import HookOptions, SimHook

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture (this module handles SIGTERM/SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _engine_proto(engine: Engine, api_port: int) -> tpb.Engine:
    cfg = engine.config
    return tpb.Engine(
        engine_id=cfg.engine_id,
        role=tpb.ENGINE_ROLE_PREFILL if cfg.role == "prefill" else tpb.ENGINE_ROLE_DECODE,
        model=cfg.served_model_name,
        side_channel_host=cfg.host,
        side_channel_port=cfg.side_channel_port,
        http_base_url=f"http://{cfg.host}:{api_port}",
        registration_generation=engine.generation,
        kv_blocks_ttl_seconds=max(1, round(cfg.ttl_seconds)),
        block_size=cfg.block_size,
        tp_size=cfg.tp_size,
        dcp_size=1,
        pp_size=1,
        bytes_per_block=cfg.profile.bytes_per_token * cfg.block_size,
        kv_recompute_threshold=cfg.recompute_threshold,
    )


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
