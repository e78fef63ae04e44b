"""A folder for the embedded cluster's files, for one run, when root's chosen folder is private.

PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` OS user,
which cannot reach a data folder below a private one (a clone under `/root`, any 0700
folder). The cluster then lives in a fresh folder under a base every user can traverse
(the temp folder, else /tmp, /var/tmp, /dev/shm), made by `mkdtemp`, owned by `postgres`,
mode 0700, and removed when the run ends, however it ends.

A guardian process removes it: it waits for EOF on a pipe whose other end only the process
that made the folder holds, so the kernel closes it when that process exits or is killed
(SIGKILL included); it then makes sure the postmaster is down and removes the folder. It runs in a session of its own so that a Ctrl-C
meant for `boomerang up` does not stop it before its work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

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


__all__ = ["PREFIX", "RunFolder", "bases", "server_user_can"]
