"""`boomerang status` and `boomerang audit` find the stack `boomerang up --free-ports` started from
the same folder, with no flags (issue 26): `up` writes .boomerang/context.json, the CLI reads
it; a flag or an environment variable still wins; the file goes when `up` stops.

Also here, since the stack is up: library logging stays quiet unless `-v`, and a wrong
password is refused in one line by the embedded cluster (the local server trusts every
password, so test_cli_bad_input.py cannot check that one).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import BOOMERANG

pytestmark = pytest.mark.e2e
MODEL = "Qwen/Qwen3-32B"  # the qwen3-32b profile's served name
ADDRESS_VARIABLES = ("BOOMERANG_DATABASE_URL", "BOOMERANG_REGISTRY_ADDRESS", "BOOMERANG_ROUTER_ADDRESS",
                     "BOOMERANG_REAPER_ADDRESS", "BOOMERANG_GATEWAY_URL", "BOOMERANG_CONTEXT")


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would name an address instead of the context."""
    env = {k: v for k, v in os.environ.items() if k not in ADDRESS_VARIABLES}
    return {**env, **extra}


@dataclass
class Up:
    """A `boomerang up` running in its own folder, and what it printed."""

    folder: Path
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def context(self) -> dict[str, Any]:
        return dict(json.loads((self.folder / ".boomerang" / "context.json").read_text()))

    def boomerang(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`boomerang ARGS` run from the folder `up` was started in."""
        return subprocess.run([BOOMERANG, *args], capture_output=True, text=True, timeout=60, cwd=self.folder,
                              env=_clean_env(**env))


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    # A folder the `postgres` OS user can reach (the embedded cluster runs as that user under root).
    folder = Path(tempfile.mkdtemp(prefix="boomerang-ctx-"))
    folder.chmod(0o755)
    proc = subprocess.Popen([BOOMERANG, "up", "--sim", "1x1", "--free-ports", "--time-scale", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder,
                            env=_clean_env(), start_new_session=True)
    stack = Up(folder, proc)
    ready: queue.Queue[bool] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            stack.lines.append(line.rstrip())
            if line.startswith("BOOMERANG_READY"):
                ready.put(True)
        ready.put(False)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert ready.get(timeout=180), "\n".join(stack.lines)
        yield stack
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def conversation(up: Up) -> str:
    """Two turns of one conversation through `up`'s anonymous gateway."""
    conv = f"ctx-{uuid.uuid4().hex[:8]}"
    messages: list[dict[str, str]] = []
    with httpx.Client(timeout=30) as http:
        for text in ("hello there, " * 40, "and once more, " * 40):
            messages.append({"role": "user", "content": text})
            resp = http.post(up.context["gateway"] + "/v1/chat/completions",
                             json={"model": MODEL, "conversation_id": conv, "messages": messages, "max_tokens": 8})
            assert resp.status_code == 200, resp.text
            messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
    return conv


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_up_writes_where_everything_listens(up: Up) -> None:
    ctx = up.context
    printed = "\n".join(up.lines)
    for name in ("registry", "router", "reaper"):
        assert f"  {name}" in printed and ctx[name] in printed, (name, ctx)
        assert ctx[name] not in ("127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50053")  # --free-ports
    assert ctx["gateway"].startswith("http://127.0.0.1:") and ctx["tenant"] == "anonymous"
    assert ctx["database_url"].startswith("postgresql://boomerang:")  # the embedded cluster's
    assert ((up.folder / ".boomerang" / "context.json").stat().st_mode & 0o777) == 0o600


def test_the_banner_shows_the_inspection_commands_as_they_work(up: Up) -> None:
    assert "  boomerang status" in up.lines
    assert "  boomerang audit demo-1" in up.lines


def test_status_with_no_flags_reads_the_stack(up: Up, conversation: str) -> None:
    out = up.boomerang("status", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    ctx = up.context
    assert d["registry"] == ctx["registry"]
    assert {e["role"] for e in d["engines"] if e["status"] == "ACTIVE"} == {"PREFILL", "DECODE"}
    assert d["router"]["address"] == ctx["router"] and "error" not in d["router"], d["router"]
    assert d["reaper"]["address"] == ctx["reaper"] and "error" not in d["reaper"], d["reaper"]
    # The gateway's /metrics, found through the context too: both turns counted.
    assert d["reuse"]["outcomes"]["turns"] >= 2, d["reuse"]
    # Library logging (httpx's "HTTP Request: GET …/metrics") stays out of the output.
    assert "HTTP Request" not in out.stderr, out.stderr
    verbose = up.boomerang("status", "--json", "-v")
    assert verbose.returncode == 0 and "HTTP Request" in verbose.stderr, verbose.stderr


def test_status_tables_with_no_flags(up: Up, conversation: str) -> None:
    out = up.boomerang("status")
    assert out.returncode == 0, out.stderr
    assert "Engines" in out.stdout and f"Router pool ({up.context['router']})" in out.stdout
    assert out.stderr == "", out.stderr


def test_audit_with_no_flags_uses_the_anonymous_tenant(up: Up, conversation: str) -> None:
    out = up.boomerang("audit", conversation, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["tenant"] == "anonymous" and d["conversation_id"] == conversation
    assert len(d["leases"]) >= 2 and d["summary"]["turns"] >= 1, d["summary"]


def test_a_flag_or_a_variable_still_wins(up: Up, conversation: str) -> None:
    closed = f"127.0.0.1:{_closed_port()}"
    by_flag = up.boomerang("status", "--registry", closed)
    assert by_flag.returncode == 1 and f"cannot reach the registry at {closed}" in by_flag.stderr, by_flag.stderr
    by_env = up.boomerang("status", BOOMERANG_REGISTRY_ADDRESS=closed)
    assert by_env.returncode == 1 and "$BOOMERANG_REGISTRY_ADDRESS" in by_env.stderr, by_env.stderr
    other_tenant = up.boomerang("audit", conversation, "--tenant", "someone-else")
    assert other_tenant.returncode == 1 and "for tenant 'someone-else'" in other_tenant.stderr, other_tenant.stderr
    no_context = up.boomerang("audit", conversation, BOOMERANG_CONTEXT="")
    assert no_context.returncode == 2 and "--tenant is required" in no_context.stderr


def test_the_database_of_the_context_and_a_wrong_password(up: Up) -> None:
    url = up.context["database_url"]
    right = up.boomerang("tenants", "list", "--database-url", url)
    assert right.returncode == 0, right.stderr
    password = url.split("://boomerang:", 1)[1].split("@", 1)[0]
    wrong = up.boomerang("tenants", "list", "--database-url", url.replace(password, "not-the-password"))
    lines = wrong.stderr.strip().splitlines()
    assert wrong.returncode == 1 and len(lines) == 1 and "Traceback" not in wrong.stderr, wrong.stderr
    assert lines[0].startswith("boomerang tenants: the database at postgresql://boomerang@127.0.0.1:")
    assert "refused the credentials" in lines[0] and "not-the-password" not in lines[0], lines[0]


def test_the_context_goes_when_up_stops(up: Up) -> None:
    # Last in this module: it stops the stack.
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=60) == 0, "\n".join(up.lines[-30:])
    assert not (up.folder / ".boomerang" / "context.json").exists()
