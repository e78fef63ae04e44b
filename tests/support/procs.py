"""Start Boomerang's services as real processes for end-to-end tests.

A service prints `BOOMERANG_READY <name> <host:port>` once it listens; `ServiceProcess`
starts it on port 0 (or a given port), waits for that line and exposes the address.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOMERANG = str(Path(sys.executable).with_name("boomerang"))


class ServiceProcess:
    """One `boomerang <command>` process."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, name: str = ""):
        self.args = args
        # Small pools: a full test run has many services up at once on one Postgres
        # (max_connections defaults to 100); a test may still ask for more.
        self.env = {**os.environ, "BOOMERANG_DB_POOL_SIZE": "3", **(env or {})}
        self.name = name or args[0]
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.addresses: dict[str, str] = {}  # by the name on each READY line (one process may serve several)
        self.lines: list[str] = []

    def start(self, timeout: float = 60.0, ready_name: str = "") -> ServiceProcess:
        """Start and wait until the service reports it is listening (`ready_name`: the service of
        that name, in a process that serves several)."""
        self.proc = subprocess.Popen(
            [BOOMERANG, *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )
        ready: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if line.startswith("BOOMERANG_READY"):
                    self.addresses[line.split()[1]] = line.split()[-1]
                    if line.split()[1] == ready_name or not ready_name:
                        ready.put(line.split()[-1])
            ready.put("")

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        try:
            self.address = ready.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"{self.name} did not start in {timeout}s:\n" + self.output()) from None
        if not self.address:
            # Reap it and close its pipe here: left to the garbage collector, the Popen's
            # ResourceWarnings surfaced in whichever later test collected it, failing that one too.
            self.kill()
            raise RuntimeError(f"{self.name} exited before listening:\n" + self.output())
        return self

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.address.rsplit(":", 1)[1])

    def output(self) -> str:
        """Everything it printed so far."""
        return "\n".join(self.lines[-200:])

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self._close_pipe()
        return code

    def kill(self) -> None:
        """SIGKILL the process (no drain, no cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None and not self.proc.stdout.closed:
            self.pump.join(timeout=5)
            self.proc.stdout.close()

    def alive(self) -> bool:
        """Whether it is still running."""
        return self.proc is not None and self.proc.poll() is None


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    """Poll `predicate` until true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def pid_gone(pid: int) -> bool:
    """Whether process `pid` has exited: no such process, or a zombie its parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
