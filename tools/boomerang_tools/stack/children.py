"""Child processes `boomerang <service> …`: started, awaited until ready, logged, stopped.

Each child's output goes to `<log_dir>/<name>.log`; the child is ready when it prints
`BOOMERANG_READY <name> <host:port>`. Children run in their own process group, so Ctrl-C on
the parent reaches them only through `stop_all()`: in waves, highest first (the gateway,
then what it calls, the registry last), each with SIGTERM and a deadline before SIGKILL.
If the parent dies without stopping them (SIGKILL), each gets SIGTERM from the kernel and
drains on its own.

That holds for any child started with `preexec_fn=die_with_parent(sig)` (postgres too): on
Linux the child asks the kernel, between fork and exec, to send it a signal when its parent
goes away (`prctl(PR_SET_PDEATHSIG)`); the setting survives `exec` of an ordinary binary.
Elsewhere there is no such call and a child outlives a parent that was killed with SIGKILL.
The kernel sends the signal when the *thread* that forked the child ends, not the process,
so only children started from the main thread are armed: a worker thread that started one
and then finished would otherwise stop it at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib.metadata import Distribution, distributions
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, here: the forked child must not load libraries before it execs.
_PRCTL = _load_prctl()


def die_with_parent(signum: int) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `signum` when this process dies.

    None where that is not supported (no prctl, or not the main thread: see the module
    docstring). Runs in the child after Popen's `user=`/`group=` changes, which would
    otherwise clear the setting.
    """
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def tail(path: Path, name: str, lines: int = 15) -> str:
    """The last `lines` lines of the log at `path`, each marked `  name| `."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(f"  {name}| {line}" for line in text[-lines:])


def terminate(proc: subprocess.Popen[Any] | None, sig: int, timeout: float,
              then: int = signal.SIGKILL) -> None:
    """Send `sig` to `proc` if it still runs, wait up to `timeout` for it to exit, then `then`."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(then)
        proc.wait(10)


class ChildFailed(RuntimeError):
    """A child exited or did not become ready; the message ends with its last log lines."""


@functools.cache
def boomerang_script() -> Path:
    """The `boomerang` script of the Boomerang installed here: children run it (so `ps` shows
    `boomerang registry`, …), never a module by name."""
    # Every installation named boomerang, in path order: a build's boomerang.egg-info in the
    # working directory (on sys.path under `python -m`) records no script and comes first.
    for dist in distributions(name="boomerang"):
        if (script := recorded_script(dist)) is not None:
            return script
    raise ChildFailed("Boomerang is installed without its `boomerang` script; reinstall it "
                      "(`make setup`, or `pip install --force-reinstall .`)")


def recorded_script(dist: Distribution) -> Path | None:
    """The `boomerang` script `dist`'s installation wrote, where its record says (a virtualenv's
    bin/, ~/.local/bin, …: not always beside the interpreter), if it is there."""
    for file in dist.files or ():
        if file.name == "boomerang" and file.parent.name == "bin":
            path = Path(str(dist.locate_file(file))).resolve()
            if os.access(path, os.X_OK):
                return path
    return None


class Child:
    """One `boomerang <args>` process."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 wave: int = 0, stopped_line: str = "", calls_nobody: bool = False):
        self.name = name
        self.wave = wave  # stop_all stops higher waves first
        # The log line after which it neither serves nor calls anyone (else: its exit).
        self.stopped_line = stopped_line
        # Once signalled it calls nothing the next wave must serve (an engine whose heartbeats
        # stop with it), so that wave need not wait for it.
        self.calls_nobody = calls_nobody
        self._quiet = threading.Event()
        self.args = args
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.metrics_address = ""  # from its BOOMERANG_METRICS line, when it serves metrics
        self._ready: queue.Queue[tuple[str, str]] = queue.Queue()  # (name, address); ("", ""): exited
        self._seen: dict[str, str] = {}  # READY lines read while waiting for another name
        self._log: IO[str] | None = None
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        """Start the process (does not wait)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._seen.clear()
        self._log = open(self.log_path, "a", buffering=1)  # noqa: SIM115 - open while the child runs; stop() closes it
        self._log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} boomerang {' '.join(self.args)}\n")
        self.proc = subprocess.Popen(
            [str(boomerang_script()), *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509 - one pre-resolved prctl call
        )
        self._pump = threading.Thread(target=self._read, name=f"log-{self.name}", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self._log is not None
        for line in self.proc.stdout:
            self._log.write(line)
            if line.startswith("BOOMERANG_READY"):
                words = line.split()
                self._ready.put((words[1] if len(words) > 2 else "", words[-1]))
            elif line.startswith("BOOMERANG_METRICS"):
                self.metrics_address = line.split()[-1]
            elif self.stopped_line and line.rstrip().endswith(self.stopped_line):
                self._quiet.set()
        self._quiet.set()
        self._ready.put(("", ""))

    def wait_ready(self, timeout: float = 60.0, name: str | None = None) -> str:
        """The address it listens on, once ready (the one its READY line for `name` gives: a
        process serving several services prints one line each); ChildFailed otherwise."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if name in self._seen:
                    address = self._seen[name]
                    break
                said, address = self._ready.get(timeout=max(deadline - time.monotonic(), 0.001))
                if name is None or not address:
                    break
                self._seen[said] = address
        except queue.Empty:
            self.stop(5)
            raise ChildFailed(f"{self.name} did not start within {timeout:.0f}s\n{self.tail()}") from None
        if not address:
            # Its output ended: it is exiting. Wait for that, so that alive() says so to a caller
            # deciding whether to start it again (the end of output can come before the exit).
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
            raise ChildFailed(f"{self.name} exited before it was ready\n{self.tail()}")
        if name is None or not self.address:
            self.address = address  # the process's address: its first (or only) service's
        return address

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        return tail(self.log_path, self.name, lines)

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send a signal to its process group."""
        if self.alive():
            assert self.proc is not None
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait_quiet(self, timeout: float) -> bool:
        """Wait until it has stopped serving and calling (its stopped line, or its exit)."""
        return self.proc is None or self._quiet.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
        self.signal(signal.SIGTERM)
        return self.finish(timeout)

    def finish(self, timeout: float = 15.0) -> int | None:
        """Wait up to `timeout` for it to exit (after a SIGTERM), then SIGKILL; returns the exit code."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self._pump is not None:
            self._pump.join(timeout=5)
        if self.proc.stdout is not None and not (self._pump is not None and self._pump.is_alive()):
            self.proc.stdout.close()
        if self._log is not None and not self._log.closed:
            self._log.close()
        return self.proc.returncode


def stop_all(children: list[Child], timeout: float = 15.0, then: Callable[[], None] | None = None) -> None:
    """Stop children wave by wave, highest first, so each drains while what it calls (the
    gateway → router → registry) still answers; a wave's children stop side by side.

    The next wave starts once this one has stopped serving and calling (not once its
    interpreters have exited); `then` runs after the last wave (the database stops there),
    and finally every child is awaited, SIGKILL after `timeout`.
    """
    try:
        for wave in sorted({c.wave for c in children}, reverse=True):
            members = [c for c in children if c.wave == wave]
            for child in members:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in members:
                if child.calls_nobody:
                    continue
                if not child.wait_quiet(max(0.1, deadline - time.monotonic())):
                    child.signal(signal.SIGKILL)  # stuck: what it calls is about to go
        if then is not None:
            then()
    finally:
        deadline = time.monotonic() + timeout
        for child in children:
            child.finish(max(0.1, deadline - time.monotonic()))
