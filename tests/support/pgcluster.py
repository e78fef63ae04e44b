"""A PostgreSQL primary and a streaming standby of the test's own, for failover tests.

Real parts only: the system's PostgreSQL 15 binaries, `initdb`, `pg_basebackup -R` (the
standby streams from the primary, asynchronously unless made synchronous), each server on
a free loopback port and a temporary data folder, both removed by `close()`. Each postmaster
is the test process's child and gets SIGQUIT (immediate shutdown) if that process dies. As
root, the servers run as the `postgres` OS user.

The services reach whichever server is the primary through one multi-host URL
(`url`: the standby listed first, `target_session_attrs=read-write`), as behind a virtual IP.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from boomerang_tools.stack.children import die_with_parent
from boomerang_tools.stack.postgres import free_port

BIN = Path(os.environ.get("BOOMERANG_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
DATABASE = "boomerang"


def available() -> bool:
    """Whether the binaries this helper needs are installed."""
    return all((BIN / b).exists() for b in ("initdb", "pg_basebackup", "postgres", "psql"))


def _server_user() -> pwd.struct_passwd | None:
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def _run_as() -> list[str]:
    ent = _server_user()
    return [] if ent is None else ["setpriv", f"--reuid={ent.pw_uid}", f"--regid={ent.pw_gid}", "--init-groups"]


def _run(*cmd: str, timeout: float = 120) -> str:
    out = subprocess.run([*_run_as(), *cmd], capture_output=True, text=True, cwd="/", timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return out.stdout


class Node:
    """One PostgreSQL server: its data folder, port and postmaster."""

    def __init__(self, name: str, data: Path):
        self.name = name
        self.data = data
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str = DATABASE) -> str:
        """A superuser's URL to `database` on this server alone."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def configure(self, **settings: str) -> None:
        """Append settings to postgresql.conf (read at the next start or reload)."""
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{key} = '{value}'\n" for key, value in settings.items())

    def start(self, timeout: float = 60.0) -> None:
        """Start the postmaster and wait until it answers (on another free port if another
        process took this one since it was chosen)."""
        for _ in range(3):
            try:
                return self._start(timeout)
            except RuntimeError:
                if "could not bind" not in self.log():
                    raise
                self.port = free_port()
        self._start(timeout)

    def _start(self, timeout: float) -> None:
        ent = _server_user()
        with open(self.data.parent / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "postgres"), "-D", str(self.data), "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/", start_new_session=True,
                user=ent.pw_uid if ent else None, group=ent.pw_gid if ent else None,
                extra_groups=[] if ent else None,
                preexec_fn=die_with_parent(signal.SIGQUIT),  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout
        while subprocess.run([str(BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                             check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        """The server log's last lines."""
        path = self.data.parent / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-30:]) if path.exists() else ""

    def sql(self, query: str, database: str = DATABASE) -> str:
        """One statement through psql, its rows as `|`-separated text lines."""
        out = subprocess.run([str(BIN / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-At", "-h", "127.0.0.1",
                              "-p", str(self.port), "-U", "postgres", "-d", database, "-c", query],
                             capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{self.name}: {query!r} failed: {out.stderr}")
        return out.stdout.strip()

    def kill(self) -> None:
        """Immediate shutdown (`pg_ctl stop -m immediate`: SIGQUIT), as a crash loses the server."""
        self._stop(signal.SIGQUIT)

    def stop(self) -> None:
        """Fast shutdown."""
        self._stop(signal.SIGINT)

    def _stop(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class ReplicatedPostgres:
    """A primary with one streaming standby; `start()`, then `close()` (always)."""

    def __init__(self, synchronous: bool = False):
        self.synchronous = synchronous
        self.folder = Path(tempfile.mkdtemp(prefix="boomerang-pgrepl-"))
        self.folder.chmod(0o755)
        ent = _server_user()
        if ent is not None:
            os.chown(self.folder, ent.pw_uid, ent.pw_gid)
        self.primary = Node("primary", self.folder / "primary")
        self.standby = Node("standby", self.folder / "standby")

    @property
    def url(self) -> str:
        """The services' one address: both servers, the read-write one chosen at each connect."""
        return (f"postgresql://postgres@127.0.0.1:{self.standby.port},127.0.0.1:{self.primary.port}/{DATABASE}"
                "?target_session_attrs=read-write")

    def start(self) -> ReplicatedPostgres:
        """initdb the primary, start it, clone the standby from it and wait until it streams."""
        try:
            _run(str(BIN / "initdb"), "-D", str(self.primary.data), "-U", "postgres", "--auth=trust", "-N",
                 "--no-instructions")
            self.primary.configure(listen_addresses="127.0.0.1", unix_socket_directories="", max_connections="60",
                                   shared_buffers="16MB", wal_keep_size="64MB", hot_standby="on")
            self.primary.start()
            self.primary.sql(f"CREATE DATABASE {DATABASE}", database="postgres")
            _run(str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                 "-D", str(self.standby.data), "-R", "-X", "stream", "-c", "fast")
            self.standby.start()
            self._wait(lambda: self.primary.sql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
                       == "1", "the standby to stream")
            if self.synchronous:
                self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                self.primary.sql("SELECT pg_reload_conf()")
                self._wait(lambda: self.primary.sql("SELECT sync_state FROM pg_stat_replication") == "sync",
                           "the standby to be synchronous")
        except BaseException:
            self.close()
            raise
        return self

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        target = self.primary.sql("SELECT pg_current_wal_lsn()")
        self._wait(lambda: self.standby.sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn") == "t",
                   "the standby to replay the primary's WAL")

    def cut_replication(self) -> None:
        """Stop the standby's WAL receiver (no primary to stream from; PG 13+ applies it on reload)."""
        self.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.sql("SELECT pg_reload_conf()")
        self._wait(lambda: self.primary.sql("SELECT count(*) FROM pg_stat_replication") == "0",
                   "the standby's replication to stop")

    def fail_over(self) -> None:
        """Kill the primary (immediate shutdown) and promote the standby."""
        self.primary.kill()
        self.standby.sql("SELECT pg_promote(true, 60)")

    def close(self) -> None:
        """Stop both servers and remove their folders."""
        for node in (self.primary, self.standby):
            node.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _wait(predicate, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)
