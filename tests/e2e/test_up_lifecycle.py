"""`boomerang up` takes everything it started along, however it ends (issue 15): SIGKILL
leaves no process (services, engines, the embedded Postgres and its backends) and no port
behind within seconds; SIGTERM stops everything within 5 s and exits 0."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import ServiceProcess, wait_for

pytestmark = pytest.mark.e2e
ENDPOINT = re.compile(r"^\s+(postgres|registry|prefill|decode|router|reaper|gateway)\s+(?:http://)?([\d.]+):(\d+)",
                      re.MULTILINE)


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid → (parent pid, start time)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(entry.name)] = (int(fields[1]), fields[19])
    return out


def _descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process below `root`, the start time telling a reused pid apart."""
    procs = _processes()
    found: set[tuple[int, str]] = set()
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start) in procs.items():
            if ppid == parent:
                found.add((pid, start))
                todo.append(pid)
    return found


def _alive(started: set[tuple[int, str]]) -> set[tuple[int, str]]:
    procs = _processes()
    return {(pid, start) for pid, start in started if procs.get(pid, (0, ""))[1] == start}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """up's data folder (embedded cluster and logs) where the `postgres` OS user can reach it."""
    path = Path(tempfile.mkdtemp(prefix="boomerang-up-"))
    path.chmod(0o755)
    yield path / ".boomerang"
    shutil.rmtree(path, ignore_errors=True)


def _up(data_dir: Path) -> tuple[ServiceProcess, set[tuple[int, str]], dict[str, int]]:
    """`boomerang up` on its own embedded Postgres, with what it started and the ports it printed."""
    up = ServiceProcess(["up", "--sim", "1x1", "--free-ports", "--time-scale", "0", "--data-dir", str(data_dir)],
                        name="up")
    up.start(timeout=120)
    assert up.proc is not None
    ports = {name: int(port) for name, _, port in ENDPOINT.findall(up.output())}
    assert set(ports) == {"postgres", "registry", "prefill", "decode", "router", "reaper", "gateway"}, up.output()
    assert "embedded" in up.output()
    started = _descendants(up.proc.pid)
    # Six services and engines, the postmaster and its backends.
    assert len(started) >= 8, started
    assert all(_listening(p) for p in ports.values())
    return up, started, ports


def test_sigkill_of_up_leaves_nothing_behind(data_dir: Path) -> None:
    up, started, ports = _up(data_dir)
    try:
        assert up.proc is not None
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait(timeout=10)
        killed = time.monotonic()
        assert wait_for(lambda: not _alive(started), timeout=10), f"still running: {_alive(started)}"
        gone_after = time.monotonic() - killed
        assert wait_for(lambda: not any(_listening(p) for p in ports.values()), timeout=5), \
            {n: p for n, p in ports.items() if _listening(p)}
        print(f"everything up started was gone {gone_after:.2f}s after SIGKILL")
    finally:
        up.kill()
        for pid, _ in _alive(started):  # only if the test failed
            import os

            os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_everything_within_five_seconds(data_dir: Path) -> None:
    up, started, ports = _up(data_dir)
    try:
        assert up.proc is not None
        sent = time.monotonic()
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(timeout=30) == 0, up.output()[-3000:]
        exited = time.monotonic() - sent
        assert not _alive(started), f"still running after up exited: {_alive(started)}"
        assert not any(_listening(p) for p in ports.values())
        print(f"up stopped everything and exited {exited:.2f}s after SIGTERM")
        assert exited < 5.0, up.output()[-3000:]
        logs = {p.stem: p.read_text() for p in (data_dir / "logs").glob("*.log")}
        assert "gateway stopped" in logs["gateway"] and "registry stopped" in logs["registry"]
    finally:
        up.kill()
