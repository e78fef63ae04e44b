"""`--profile`: sample the services with py-spy during a measured step and summarise where
their CPU went (collapsed stacks kept beside the report, and a flame graph per service)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def py_spy() -> str | None:
    """The py-spy binary next to this Python, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """py-spy record on some processes for a while."""

    def __init__(self, out_dir: Path, label: str, pids: dict[str, int], seconds: float):
        self.out_dir = out_dir
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        binary = py_spy()
        if binary is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            raw = out_dir / f"{label}-{name}.txt"
            cmd = [binary, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "250",
                   "--format", "raw", "--nonblocking", "--output", str(raw)]
            self.procs[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), raw)

    def finish(self, timeout: float = 30.0) -> dict[str, dict[str, object]]:
        """Wait for the samplers; per service, the busiest functions (self and inclusive %)."""
        out: dict[str, dict[str, object]] = {}
        for name, (proc, raw) in self.procs.items():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                continue
            if raw.exists():
                out[name] = summarize_collapsed(raw.read_text())
                out[name]["file"] = str(raw)
        return out


def _frame(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; keep function and file.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else where
    return f"{name} ({short})"


def summarize_collapsed(text: str, top: int = 15) -> dict[str, object]:
    """Top functions by self and inclusive share of samples, from py-spy's collapsed stacks."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";") if f]
        if frames:
            self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n

    def share(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "percent": round(100 * n / total, 1)} for f, n in c.most_common(top)]

    return {"samples": total, "self": share(self_time) if total else [], "inclusive": share(inclusive) if total else []}
