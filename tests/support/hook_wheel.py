"""Build the hook's wheels as `make hook-wheel` does: boomerang-client and boomerang-vllm-hook."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a build leaves in its source folder; copied sources leave them in the copy.
BUILD_LEFTOVERS = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")


def build_hook_wheels(out: Path) -> tuple[Path, Path]:
    """(the client's wheel, the hook's wheel) built into `out`, offline (no build isolation, no
    dependencies), from copies of client/ and hook/ so that nothing is written into the tree."""
    with tempfile.TemporaryDirectory(prefix="boomerang-hook-build-") as tmp:
        for name in ("client", "hook"):
            shutil.copytree(ROOT / name, Path(tmp) / name, ignore=BUILD_LEFTOVERS)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--no-build-isolation", f"{tmp}/client", f"{tmp}/hook", "-w", str(out)],
            capture_output=True, text=True, timeout=180,
        )
    assert done.returncode == 0, done.stderr
    (client,) = out.glob("boomerang_client-*.whl")
    (hook,) = out.glob("boomerang_vllm_hook-*.whl")
    return client, hook
