"""The fault campaign, short and seeded (`boomerang chaos`, docs/testing.md): 64 agents converse
through two gateways while seed 7's faults run (SIGKILL and SIGSTOP of every kind of replica and
engine, the Postgres primary killed, a Postgres restart, overlapping); every invariant holds."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from boomerang_tools.stack.children import die_with_parent
from boomerang_tools.stack.postgres import system_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SEED = 7
SECONDS = 150
INVARIANTS = ("requests failed: 0", "leases claimed twice (audit trail): 0", "leases claimed twice (engines): 0",
              "corrupt pulls or loads: 0", "reads of released or freed blocks: 0", "acknowledged registrations lost: 0",
              "served turns without their plan in the audit trail: 0", "seconds until reuse came back")


@pytest.mark.timeout(900)
def test_a_short_seeded_campaign_keeps_every_invariant(tmp_path: Path) -> None:
    if shutil.which("etcd") is None or system_binaries() is None:
        pytest.skip("etcd or the system's PostgreSQL is not installed (.ci/run installs both)")
    boomerang = str(Path(sys.executable).with_name("boomerang"))
    # If this test's process dies, the campaign gets SIGTERM and stops everything it started.
    proc = subprocess.Popen([boomerang, "chaos", "--seconds", str(SECONDS), "--seed", str(SEED),
                             "--data-dir", str(tmp_path / "chaos")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent(signal.SIGTERM))  # noqa: PLW1509 - one prctl call
    try:
        out, _ = proc.communicate(timeout=840)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    print(out)
    assert f"seed {SEED}" in out and "faults:" in out
    for kind in ("kill", "stop", "pg-failover", "pg-restart"):
        assert f" {kind} " in out, kind
    for line in INVARIANTS:
        assert f"PASS  {line}" in out, line
    assert proc.returncode == 0, out
