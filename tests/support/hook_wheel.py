"""Build the hook's own package (`hook/`, boomerang-vllm-hook) into a wheel, as `make hook-wheel` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_hook_wheel(out: Path) -> Path:
    """The wheel built from `hook/` into `out` (offline: no build isolation, no dependencies)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", str(ROOT / "hook"), "-w", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("boomerang_vllm_hook-*.whl")
    return found
