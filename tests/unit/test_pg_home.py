"""The run folder's guardian (postgres.RunFolder): it removes the folder once its maker lets go, and
first stops a server still running there, whose data is forfeit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from boomerang_tools.stack.postgres import PREFIX, RunFolder

STAND_IN = "import signal, time; signal.signal(signal.SIGQUIT, signal.SIG_DFL); print('ready', flush=True); time.sleep(60)"


def _made() -> RunFolder:
    # As the current user: the guardian does not care whose folder it is.
    return RunFolder.make([], os.getuid(), os.getgid())


def test_the_folder_goes_when_its_maker_lets_go_and_not_before() -> None:
    folder = _made()
    try:
        assert folder.path.name.startswith(PREFIX) and oct(folder.path.stat().st_mode)[-3:] == "700"
        (folder.path / "pgdata").mkdir()
        (folder.path / "pgdata" / "PG_VERSION").write_text("18\n")
        time.sleep(0.3)  # the guardian is up and waiting
        assert folder.path.exists() and folder.guardian.poll() is None
    finally:
        folder.remove()
    assert folder.guardian.returncode == 0 and not folder.path.exists()


def test_a_server_still_running_there_is_stopped_first() -> None:
    # Stands in for a postmaster whose owner died. It takes SIGQUIT's default action, as a
    # postmaster acts on it: a `sleep` inherits the disposition of whoever started the tests,
    # and a suite started in the background (`make test &`) ignores SIGQUIT, so it lingered
    # until the guardian's SIGKILL 10 s later.
    server = subprocess.Popen([sys.executable, "-c", STAND_IN], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "ready\n"  # SIGQUIT now ends it
    folder = _made()
    try:
        (folder.path / "pgdata").mkdir()
        (folder.path / "pgdata" / "postmaster.pid").write_text(f"{server.pid}\n{folder.path}/pgdata\n")
        started = time.monotonic()
        folder.remove()
        assert server.wait(timeout=5) != 0  # SIGQUIT, not a clean exit
        assert not folder.path.exists() and folder.guardian.returncode == 0
        assert time.monotonic() - started < 5
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
