"""`boomerang up` as root from a folder the `postgres` OS user cannot traverse (a clone under
/root, any 0700 folder), with no database configured, just works (issue 26): its embedded
cluster runs for the run in a folder of that user's under the temp folder, and however `up`
ends, no process and no folder is left behind."""

from __future__ import annotations

import os
import pwd
import queue
import re
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from boomerang_tools.stack.postgres import ELSEWHERE, PREFIX, find_binaries

from tests.e2e.test_up_lifecycle import _alive, _descendants
from tests.support.procs import BOOMERANG, wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(find_binaries() is None, reason="no local PostgreSQL binaries"),
              pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the cluster as another OS user")]
RUN_FOLDER = re.compile(r"data in (\S+)/pgdata for this run only")


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A 0700 folder to run `up` from, as a clone under /root is (pytest's tmp_path is private too)."""
    folder = tmp_path / "clone"
    folder.mkdir(mode=0o700)
    return folder


class Up:
    """`boomerang up --sim 1x1 --free-ports` started in `cwd` with no database configured."""

    def __init__(self, cwd: Path):
        env = {k: v for k, v in os.environ.items() if k != "BOOMERANG_DATABASE_URL"}
        self.proc = subprocess.Popen([BOOMERANG, "up", "--sim", "1x1", "--free-ports", "--time-scale", "0"],
                                     cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._ready: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("BOOMERANG_READY"):
                self._ready.put(line.split()[-1])
        self._ready.put("")

    def output(self) -> str:
        return "\n".join(self.lines)

    def close(self) -> None:
        """Kill it if it still runs (only when a test failed), reap it and close its pipe."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def wait_ready(self, timeout: float = 120.0) -> str:
        address = self._ready.get(timeout=timeout)
        assert address, f"up exited before it was ready:\n{self.output()}"
        return address


@pytest.fixture
def up(clone: Path) -> Iterator[Up]:
    started = Up(clone)
    yield started
    started.close()


def _started(up: Up) -> tuple[Path, set[tuple[int, str]]]:
    """The run folder `up` printed, checked, and every process below `up`."""
    gateway = up.wait_ready()
    found = RUN_FOLDER.search(up.output())
    assert found, up.output()
    home = Path(found.group(1))
    assert home.name.startswith(PREFIX), home
    info = home.stat()
    assert (pwd.getpwuid(info.st_uid).pw_name, stat.S_IMODE(info.st_mode)) == ("postgres", 0o700)
    # Migrated and serving: the gateway answers and sees its engines.
    assert int(httpx.get(f"http://{gateway}/health", timeout=5).json()["models"]) >= 1
    return home, _descendants(up.proc.pid)


def test_up_from_a_private_folder_stops_on_sigterm_leaving_nothing(up: Up, clone: Path) -> None:
    home, started = _started(up)
    assert (clone / ".boomerang" / ELSEWHERE).read_text().strip() == str(home)
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=30) == 0, up.output()[-3000:]
    assert not _alive(started), f"still running after up exited: {_alive(started)}"
    assert not home.exists() and not (clone / ".boomerang" / ELSEWHERE).exists()
    assert (clone / ".boomerang" / "logs" / "gateway.log").exists()  # logs stay in the folder asked for


def test_up_from_a_private_folder_killed_leaves_nothing(up: Up) -> None:
    home, started = _started(up)
    up.proc.send_signal(signal.SIGKILL)
    up.proc.wait(timeout=10)
    killed = time.monotonic()
    assert wait_for(lambda: not _alive(started), timeout=15), f"still running: {_alive(started)}"
    assert wait_for(lambda: not home.exists(), timeout=5), f"{home} outlived up"
    print(f"everything up started, and its run folder, gone {time.monotonic() - killed:.2f}s after SIGKILL")
