"""A private PostgreSQL cluster for `boomerang up` and `boomerang demo` when none is configured.

It lives in a data folder kept between runs (default `.boomerang/pgdata`), is made once with
the local `initdb`, listens only on 127.0.0.1 (a free port each start; no Unix socket), and
accepts only user `boomerang` with a generated password (kept in `.boomerang/pg-password`,
mode 0600). PostgreSQL refuses to run as root, so as root the cluster belongs to the
`postgres` OS user and every command runs through `runuser` (or `setpriv`).

An exclusive lock on `.boomerang/pg.lock` marks the owner: the process that started the
cluster stops it on exit; a second `boomerang up` on the same folder uses it and leaves it.
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import asyncpg

INSTALL_HINT = (
    "no PostgreSQL server binaries found (initdb, pg_ctl). Install them, e.g.\n"
    "  Debian/Ubuntu: sudo apt-get install postgresql\n"
    "  Fedora/RHEL:   sudo dnf install postgresql-server\n"
    "  macOS:         brew install postgresql@16\n"
    "or point Boomerang at an existing server with --database-url / BOOMERANG_DATABASE_URL."
)
USER = "boomerang"
DATABASE = "boomerang"


class PostgresError(RuntimeError):
    """The embedded cluster could not be set up or started; the message says what to do."""


def find_binaries() -> Path | None:
    """The directory holding `initdb` and `pg_ctl` (newest major version first)."""
    candidates: list[Path] = []

    def version(p: str) -> int:
        m = re.search(r"/(\d+)(?:\.\d+)?/", p)
        return int(m.group(1)) if m else 0

    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql@*/bin",
                    "/usr/local/opt/postgresql@*/bin"):
        candidates += [Path(p) for p in sorted(glob.glob(pattern), key=version, reverse=True)]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    candidates += [Path("/usr/local/pgsql/bin"), Path("/usr/bin")]
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedPostgres:
    """The cluster in `root/pgdata`."""

    root: Path
    port: int = 0
    owner: bool = False
    _lock_fd: int = -1

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "pgdata"

    @property
    def url(self) -> str:
        """The database URL services use."""
        password = (self.root / "pg-password").read_text().strip()
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{DATABASE}"

    def _run_as(self) -> list[str]:
        """The command prefix that runs a PostgreSQL binary as a non-root user."""
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresError(
                "running as root and there is no 'postgres' OS user to run PostgreSQL as; create one "
                "(useradd --system postgres) or run as a normal user"
            ) from None
        if shutil.which("runuser"):
            return ["runuser", "-u", "postgres", "--"]
        if shutil.which("setpriv"):
            ent = pwd.getpwnam("postgres")
            return ["setpriv", f"--reuid={ent.pw_uid}", f"--regid={ent.pw_gid}", "--init-groups"]
        raise PostgresError("running as root without runuser or setpriv to drop privileges for PostgreSQL")

    def _pg(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = find_binaries()
        if bindir is None:
            raise PostgresError(INSTALL_HINT)
        cmd = [*self._run_as(), str(bindir / binary), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=120)
        if check and out.returncode != 0:
            raise PostgresError(f"{binary} {' '.join(args[:3])} failed:\n{out.stdout}{out.stderr}".strip())
        return out

    def _chown_for_server(self, path: Path) -> None:
        if os.geteuid() == 0:
            ent = pwd.getpwnam("postgres")
            os.chown(path, ent.pw_uid, ent.pw_gid)

    def _init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # the server's user must reach pgdata inside it
        password = secrets.token_urlsafe(24)
        pwfile = self.root / "pg-password"
        pwfile.write_text(password + "\n")
        os.chmod(pwfile, 0o600)
        self.data.mkdir(mode=0o700, exist_ok=True)
        self._chown_for_server(self.data)
        if self._run_as():
            probe = subprocess.run([*self._run_as(), "test", "-w", str(self.data)], capture_output=True)
            if probe.returncode != 0:
                raise PostgresError(
                    f"the 'postgres' OS user cannot reach {self.data} (a parent folder is private); "
                    "run from a folder it can traverse, or give --data-dir under e.g. /var/tmp"
                )
        # initdb reads the password from a file the server's user can read; removed at once.
        temp = self.root / ".initdb-pwfile"
        temp.write_text(password + "\n")
        os.chmod(temp, 0o600)
        self._chown_for_server(temp)
        try:
            self._pg("initdb", "-D", str(self.data), "-U", USER, "--auth=scram-sha-256", f"--pwfile={temp}",
                     "-E", "UTF8", "--no-locale")
        finally:
            temp.unlink(missing_ok=True)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# boomerang up: local only, no Unix socket\n"
                "listen_addresses = '127.0.0.1'\nunix_socket_directories = ''\nmax_connections = 300\n"
            )

    def _running_port(self) -> int:
        """The port of a cluster already running on this folder, else 0."""
        pidfile = self.data / "postmaster.pid"
        if not pidfile.exists():
            return 0
        status = self._pg("pg_ctl", "status", "-D", str(self.data), check=False)
        if status.returncode != 0:
            return 0
        lines = pidfile.read_text().splitlines()
        return int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else 0

    def start(self) -> str:
        """Create (first run) and start the cluster, or join a running one; returns the URL."""
        if find_binaries() is None:
            raise PostgresError(INSTALL_HINT)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / "pg.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.owner = True
        except BlockingIOError:
            self.owner = False
        if not (self.data / "PG_VERSION").exists():
            if not self.owner:
                raise PostgresError(f"another boomerang process is creating {self.data}; try again shortly")
            self._init()
        self.port = self._running_port()
        if self.port:
            return self.url
        if not self.owner:
            raise PostgresError(f"{self.data} is locked by another boomerang process but not running")
        self.port = free_port()
        log = self.data / "server.log"
        self._pg("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(log), "-o", f"-p {self.port}")
        self._ensure_database()
        return self.url

    def _ensure_database(self) -> None:
        password = (self.root / "pg-password").read_text().strip()

        async def create() -> None:
            conn = await asyncpg.connect(host="127.0.0.1", port=self.port, user=USER, password=password,
                                         database="postgres", timeout=10)
            try:
                if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
                    await conn.execute(f'CREATE DATABASE "{DATABASE}"')
            finally:
                await conn.close()

        asyncio.run(create())

    def stop(self) -> None:
        """Stop the cluster if this process started it (fast shutdown)."""
        try:
            if self.owner and self.port:
                self._pg("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", check=False)
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
