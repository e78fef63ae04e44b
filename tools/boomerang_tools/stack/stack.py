"""The whole system as child processes: Postgres, registry, sims, router, reaper, gateway.

Start order follows the dependencies — the database (embedded unless a URL is given) and
its migrations, the registry, the simulated engines (they register with the registry), the
router and the reaper (they call the registry), then the gateway (it calls the router).
Stop order is the reverse, in waves (the gateway; the router, reaper and engines side by
side; the registry; the database), each draining while what it calls still answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_gateway.settings import GatewaySettings
from boomerang_router.settings import RouterSettings
from boomerang_server.config import env_name, flag_spec
from boomerang_server.db import upgrade
from pydantic_settings import BaseSettings

from boomerang_tools.sim import hfmodel
from boomerang_tools.sim.costmodel import profile
from boomerang_tools.stack.children import Child, ChildFailed, stop_all
from boomerang_tools.stack.ha_postgres import HaPostgres
from boomerang_tools.stack.postgres import EmbeddedPostgres, free_port

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimSpec:
    """One simulated engine."""

    role: str  # "prefill" or "decode"
    profile: str
    port: int  # 0: a free one
    args: tuple[str, ...] = ()  # this engine's own flags, after the stack's `sim_args`


@dataclass
class StackConfig:
    """What to run."""

    data_dir: Path = Path(".boomerang")
    database_url: str = ""
    gateway_port: int = 8000
    grpc_ports: tuple[int, int, int] = (50051, 50052, 50053)  # registry, router, reaper; 0: free
    sims: list[SimSpec] = field(default_factory=list)
    prefill_urls: list[str] = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    ttl_seconds: float = 480.0
    time_scale: float = 1.0
    allow_anonymous: bool = True
    strip_reasoning: bool = False
    sim_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)
    gateway_env: dict[str, str] = field(default_factory=dict)  # settings the gateway has no flag for
    log_level: str = "INFO"
    # The simulated engines run Boomerang's vLLM hook (`sim --hook`) and the gateway only
    # routes (`--engine-hook`).
    hook: bool = False
    # A highly available Postgres for this run (ha_postgres.py: Patroni on etcd) with this many
    # nodes instead of the embedded cluster; 0: none. Synchronous: Patroni's synchronous_mode.
    ha_nodes: int = 0
    ha_synchronous: bool = False
    # The registry, the router and the gateway in one process (`boomerang control-plane
    # --gateway-listen`, in-process calls between them; the child is named "control-plane"),
    # not three. Their flags (`router_args`, `gateway_args`) go to it as BOOMERANG_* variables.
    single_process: bool = False
    # False: the engines and a gateway in front of them only, what an operator runs without
    # Boomerang (the demo's "off" and "prefix-cache"): no database, registry, router or
    # reaper; the gateway names the engines statically (`gateway_args` give it `--router ''`).
    control_plane: bool = True


def sims_for(spec: str, profile: str, prefill_base: int = 8100, decode_base: int = 8200) -> list[SimSpec]:
    """`PxD` (e.g. `1x1`, `2x1`) as sim specs on ports base, base+1, … (base 0: free ports)."""
    p, sep, d = spec.lower().partition("x")
    if not sep or not p.isdigit() or not d.isdigit() or not (1 <= int(p) <= 16 and 1 <= int(d) <= 16):
        raise ValueError(f"--sim wants PxD with 1 to 16 engines each, e.g. 1x1 or 2x1; got {spec!r}")
    out = [SimSpec("prefill", profile, prefill_base + i if prefill_base else 0) for i in range(int(p))]
    out += [SimSpec("decode", profile, decode_base + i if decode_base else 0) for i in range(int(d))]
    return out


def sim_tokenizers(profiles: Iterable[str], sim_args: Sequence[str], strip_reasoning: bool = False) -> dict[str, str]:
    """The gateway's BOOMERANG_TOKENIZERS entries for simulated engines of these profiles: the
    simulator's own model files (`hfmodel`), so the gateway tokenizes in-process as the bench's
    does (and as it would with a real model's files), P's /tokenize its fallback."""
    served = ""
    for n, arg in enumerate(sim_args):
        if arg == "--served-model-name" and n + 1 < len(sim_args):
            served = sim_args[n + 1]
        elif arg.startswith("--served-model-name="):
            served = arg.partition("=")[2]
    folder = str(hfmodel.folder(thinking=strip_reasoning or "--strip-reasoning" in sim_args))
    return {served or profile(p).served_model_name: folder for p in profiles}


def tokenizers_env(entries: dict[str, str]) -> dict[str, str]:
    """BOOMERANG_TOKENIZERS for a gateway child: `entries`, after any the caller set for itself
    (those win for their models)."""
    if not entries:
        return {}
    given = os.environ.get("BOOMERANG_TOKENIZERS", "").strip()
    named = {item.partition("=")[0].strip() for item in given.split(",")}
    ours = [f"{model}={where}" for model, where in entries.items() if model not in named]
    return {"BOOMERANG_TOKENIZERS": ",".join([given, *ours] if given else ours)}


@dataclass
class Endpoint:
    """One running piece, as printed."""

    name: str
    address: str
    note: str = ""


class Stack:
    """Starts and stops the whole system."""

    def __init__(self, config: StackConfig):
        self.config = config
        self.children: list[Child] = []
        self.postgres: EmbeddedPostgres | None = None
        self.ha: HaPostgres | None = None
        self.database_url = ""
        self.endpoints: list[Endpoint] = []
        self.gateway_url = ""
        self.prefill_urls: list[str] = []
        self.decode_urls: list[str] = []
        self.registry_address = ""
        self.router_address = ""
        self.reaper_address = ""
        self.sim_engine_ids: list[str] = []

    @property
    def log_dir(self) -> Path:
        """Where each child's log goes."""
        return self.config.data_dir / "logs"

    def _env(self) -> dict[str, str]:
        # The URL (with its password) goes by environment, never on a command line.
        return {
            "BOOMERANG_DATABASE_URL": self.database_url,
            "BOOMERANG_MIGRATE_ON_START": "false",
            "BOOMERANG_LOG_LEVEL": self.config.log_level,
            "BOOMERANG_DRAIN_DELAY_SECONDS": "0.2",
            "BOOMERANG_GRACE_SECONDS": "5",
        }

    def _spawn(self, name: str, args: list[str], wave: int, env: dict[str, str] | None = None) -> Child:
        # Services log "<name> stopped" once they neither serve nor call. Engines only heartbeat
        # (they are retired in the registry before they stop), so the registry need not wait.
        engine = args[0] == "sim"
        child = Child(name, args, self.log_dir, {**self._env(), **(env or {})}, wave,
                      "" if engine else f"{args[0]} stopped", engine)
        child.start()
        self.children.append(child)
        return child

    def start(self) -> None:
        """Start everything; on any failure stop what started and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _database(self) -> None:
        # Quiet: alembic logs its plugin set-up at INFO (at import, before logging is configured, it
        # is not shown at all).
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)

        if self.config.database_url:
            self.database_url = self.config.database_url
            note = "configured"
        elif self.config.ha_nodes:
            self.ha = HaPostgres(self.config.ha_nodes, self.config.ha_synchronous)
            self.database_url = self.ha.start()
            note = self.ha.where
        else:
            self.postgres = EmbeddedPostgres(self.config.data_dir.resolve())
            self.database_url = self.postgres.start()
            note = f"embedded ({self.postgres.source}), {self.postgres.where}"
        upgrade(self.database_url)
        if self.postgres is not None:
            # A new cluster and its migrations leave MBs of dirty pages; written now, not by
            # the shutdown checkpoint that a stop has to wait for.
            self.postgres.checkpoint()
        parts = urlsplit(self.database_url)
        hosts = parts.netloc.rpartition("@")[2]  # one host:port, or a multi-host list
        self.endpoints.append(Endpoint("postgres", f"{hosts if ':' in hosts else hosts + ':5432'}{parts.path}", note))

    def _start(self) -> None:
        cfg = self.config
        if cfg.single_process and (cfg.prefill_urls or cfg.decode_urls):
            raise ValueError("a single-process stack finds its engines in the registry: no static engines")
        registry_port, router_port, reaper_port = cfg.grpc_ports
        gateway_flags = [*(["--allow-anonymous"] if cfg.allow_anonymous else []), *(["--engine-hook"] if cfg.hook else []),
                         *cfg.gateway_args]
        gateway_env = {**tokenizers_env(sim_tokenizers({s.profile for s in cfg.sims}, cfg.sim_args, cfg.strip_reasoning)),
                       **cfg.gateway_env}
        registry = None
        if cfg.control_plane:
            self._database()
        if cfg.single_process:
            registry = self._spawn("control-plane", [
                "control-plane", "--listen", f"127.0.0.1:{registry_port}",
                "--gateway-listen", f"127.0.0.1:{cfg.gateway_port}"], 0,
                {**flags_env(cfg.router_args, RouterSettings), **flags_env(gateway_flags, GatewaySettings), **gateway_env})
            self.registry_address = registry.wait_ready(name="control-plane")
            router_port = int(self.registry_address.rpartition(":")[2])
        elif cfg.control_plane:
            registry = self._spawn("registry", ["registry", "--listen", f"127.0.0.1:{registry_port}"], 0)
            self.registry_address = registry.wait_ready()
        if self.registry_address:
            self.endpoints.append(Endpoint("registry", self.registry_address, "gRPC BlockRegistryService"))
            _retire_unreachable_engines(self.registry_address)
        if cfg.hook and not router_port:
            router_port = free_port()  # the prefill engines' hooks need the router's address at start
        # The hook's planning budget as the gateway's default plan timeout (0.25 s): one busy
        # machine runs everything here, and the hook's own 20 ms default is for real hosts.
        hook_args = ["--hook", "--router", f"127.0.0.1:{router_port}", "--plan-deadline-ms", "250"] if cfg.hook else []
        registry_args = ["--registry", self.registry_address] if self.registry_address else []
        sims = []
        # A fresh engine id per run: a restarted engine must never be mistaken for the old
        # one (its blocks are gone), as vLLM's random engine ids ensure.
        run = uuid.uuid4().hex[:6]
        for i, spec in enumerate(cfg.sims):
            engine_id = f"sim-{spec.role}-{i}-{run}"
            self.sim_engine_ids.append(engine_id)
            args = ["sim", "--role", spec.role, "--port", str(spec.port), "--profile", spec.profile,
                    "--ttl", str(cfg.ttl_seconds), *registry_args,
                    "--time-scale", str(cfg.time_scale), "--engine-id", engine_id,
                    *(["--strip-reasoning"] if cfg.strip_reasoning else []), *hook_args, *cfg.sim_args, *spec.args]
            sims.append((spec, self._spawn(f"sim-{spec.role}-{i}", args, 1)))
        for spec, child in sims:
            url = f"http://{child.wait_ready()}"
            (self.prefill_urls if spec.role == "prefill" else self.decode_urls).append(url)
            self.endpoints.append(Endpoint(f"{spec.role}", url, f"simulated engine, profile {spec.profile}"))
        for url in cfg.prefill_urls:
            self.prefill_urls.append(url)
            self.endpoints.append(Endpoint("prefill", url, "external engine"))
        for url in cfg.decode_urls:
            self.decode_urls.append(url)
            self.endpoints.append(Endpoint("decode", url, "external engine"))
        static: list[str] = []
        if cfg.prefill_urls or cfg.decode_urls or not cfg.control_plane:
            # External engines may not register themselves (and with no control plane none
            # does); name every engine statically.
            static = [a for u in self.prefill_urls for a in ("--prefill", u)]
            static += [a for u in self.decode_urls for a in ("--decode", u)]
        reaper = None
        if cfg.control_plane:
            reaper = self._spawn("reaper", ["reaper", "--listen", f"127.0.0.1:{reaper_port}",
                                            "--registry", self.registry_address], 1)
        if registry is not None and cfg.single_process:
            self.router_address = self.registry_address
            self.gateway_url = f"http://{registry.wait_ready(name='gateway')}"
        else:
            calls: list[str] = []
            if cfg.control_plane:
                router = self._spawn("router", ["router", "--listen", f"127.0.0.1:{router_port}",
                                                "--registry", self.registry_address, *static, *cfg.router_args], 1)
                self.router_address = router.wait_ready()
                calls = ["--router", self.router_address, "--registry", self.registry_address]
            gateway = self._spawn("gateway", ["gateway", "--listen", f"127.0.0.1:{cfg.gateway_port}",
                                              *calls, *static, *gateway_flags], 2, gateway_env)
            self.gateway_url = f"http://{gateway.wait_ready()}"
        if reaper is not None:
            self.endpoints.append(Endpoint("router", self.router_address, "gRPC RouterService"))
            self.reaper_address = reaper.wait_ready()
            self.endpoints.append(Endpoint("reaper", self.reaper_address, "gRPC TTLReaperService"))
        access = "anonymous allowed" if cfg.allow_anonymous else "API keys required"
        self.endpoints.append(Endpoint("gateway", self.gateway_url + "/v1", f"OpenAI-compatible, {access}"))
        self._wait_engines()

    def _wait_engines(self) -> None:
        """Wait until the router (if any) and the gateway both see every engine (they poll the
        registry)."""
        models = {s.profile for s in self.config.sims} | ({"external"} if self.config.prefill_urls else set())
        asyncio.run(wait_engines(self.router_address, len(self.prefill_urls) + len(self.decode_urls),
                                 self.gateway_url, models=len(models)))

    def dead_children(self) -> list[Child]:
        """Children that exited."""
        return [c for c in self.children if not c.alive()]

    def stop(self) -> None:
        """Stop every child (reverse order), then the embedded database if this stack started it.

        The simulated engines are first marked dead in the registry (their blocks die with
        them), so nothing plans on them while they stop or after.
        """
        try:
            if self.registry_address and self.sim_engine_ids:
                _retire(self.registry_address, self.sim_engine_ids, "ENGINE_STOPPED")
            stop_all(self.children, then=self._stop_database)
        finally:
            self.children = []
            self._stop_database()  # again, in case a child could not be stopped: idempotent

    def _stop_database(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
        if self.ha is not None:
            self.ha.stop()


async def wait_engines(router: str, want: int, gateway_url: str = "", *, models: int = 1,
                       model: str = "", timeout: float = 30.0) -> None:
    """Until the router's pool (it polls the registry) holds `want` available engines (of
    `model`, if named; no router: skipped) and, with `gateway_url`, that gateway's /health
    counts `models` models; ChildFailed otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            available = want
            if router:
                async with RouterClient(router, timeout=2.0) as client:
                    listed = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))
                available = sum(1 for e in listed.engines if e.available)
            seen = models
            if gateway_url and available >= want:
                async with httpx.AsyncClient(timeout=2.0) as http:
                    seen = int((await http.get(gateway_url + "/health")).json().get("models", 0))
            if available >= want and seen >= models:
                return
        except Exception:  # noqa: BLE001 - not yet
            pass
        if time.monotonic() > deadline:
            raise ChildFailed(f"the router at {router or '-'} and the gateway {gateway_url or '-'} did not "
                              f"see all {want} engines{f' of {model}' if model else ''} within {timeout:.0f}s")
        await asyncio.sleep(0.2)


def flags_env(flags: Sequence[str], settings: type[BaseSettings]) -> dict[str, str]:
    """Command-line flags of a settings class (`--claim-deadline-ms 250`, `--engine-hook`) as the
    BOOMERANG_* variables the same settings read, by the settings' own flag and variable names."""
    fields = {flag_spec(name, field).name: (name, field.annotation is bool)
              for name, field in settings.model_fields.items()}
    env: dict[str, str] = {}
    i = 0
    while i < len(flags):
        if flags[i] not in fields:
            raise ValueError(f"{flags[i]} is no flag of {settings.__name__}")
        name, switch = fields[flags[i]]
        if switch:
            env[env_name(name)], i = "true", i + 1
        elif i + 1 == len(flags):
            raise ValueError(f"{flags[i]} needs a value")
        else:
            env[env_name(name)], i = flags[i + 1], i + 2
    return env


def _retire(registry: str, engine_ids: list[str], reason: str) -> None:
    """Mark engines dead in the registry, ending their leases (best effort)."""
    async def retire() -> None:
        async with RegistryClient(registry, timeout=3.0) as client:
            for engine_id in engine_ids:
                try:
                    await client.invalidate_engine(rpb.InvalidateEngineRequest(
                        engine_id=engine_id, reason=reason, request_id=str(uuid.uuid4())))
                except Exception:
                    log.debug("could not retire %s", engine_id, exc_info=True)

    asyncio.run(retire())


def _retire_unreachable_engines(registry: str) -> None:
    """Mark dead the engines a previous run left active whose HTTP API no longer answers."""
    async def find() -> list[str]:
        async with RegistryClient(registry, timeout=3.0) as client:
            listed = await client.list_engines(rpb.ListEnginesRequest())
        gone = []
        async with httpx.AsyncClient(timeout=0.5) as http:
            for e in listed.engines:
                if e.status != tpb.ENGINE_STATUS_ACTIVE or not e.http_base_url:
                    continue
                try:
                    await http.get(e.http_base_url.rstrip("/") + "/health")
                except httpx.HTTPError:
                    gone.append(e.engine_id)
        return gone

    try:
        gone = asyncio.run(find())
    except Exception:
        log.debug("could not list engines", exc_info=True)
        return
    if gone:
        _retire(registry, gone, "ENGINE_UNREACHABLE")
