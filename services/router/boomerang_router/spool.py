"""The on-disk spool of `turn_plans` rows Postgres could not take.

When Postgres refuses the audit writer's batches (an outage), the rows go here instead of
being dropped: append-only JSON-lines segment files in one directory, each append fsync'd
before it counts as kept. The writer replays the segments (oldest first) once Postgres
answers again — on start, too, so a router restarted after an outage writes what its
predecessor spooled — and deletes a segment only after every row of it was written. The
write is the audit upsert keyed by plan id, so a segment replayed twice (a crash between
its last write and its deletion) still leaves one row per plan.

A process holds an exclusive `flock` on the segment it appends to and on one it replays, so
routers sharing a directory never replay a segment still being written, nor the same one at
once; the kernel drops the lock of a killed process. The spool is bounded in bytes: past
`max_bytes` rows are refused, counted and logged, and `boomerang_router_audit_spool_full`
reads 1.

All file work is blocking, so callers run it in a thread (`asyncio.to_thread`), never on
the event loop.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from boomerang_server.db.models import turn_plans
from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

SPOOLED = Counter("boomerang_router_audit_rows_spooled", "turn_plans rows written to the on-disk spool")
REPLAYED = Counter("boomerang_router_audit_rows_replayed", "spooled turn_plans rows written to Postgres")
SPOOL_BYTES = Gauge("boomerang_router_audit_spool_bytes", "Bytes of turn_plans rows waiting in the on-disk spool")
SPOOL_FULL = Gauge(
    "boomerang_router_audit_spool_full",
    "1 while the on-disk audit spool is full and turn_plans rows are being dropped",
)
SET_ASIDE = Counter(
    "boomerang_router_audit_spool_segments_set_aside",
    "Spool segments Postgres refused (not an outage), renamed *.refused for an operator",
)
SUFFIX = ".jsonl"
_DATETIME_COLUMNS = frozenset(c.name for c in turn_plans.columns if type(c.type).__name__ == "DateTime")


def encode(row: dict[str, Any]) -> bytes:
    """One spool line of a `turn_plans` row."""
    out = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
    return json.dumps(out, separators=(",", ":"), default=str).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The row of a spool line (ValueError when it is torn or not a row)."""
    row = json.loads(line)
    if not isinstance(row, dict) or "plan_id" not in row:
        raise ValueError("not a turn_plans row")
    for name in _DATETIME_COLUMNS:
        if isinstance(row.get(name), str):
            row[name] = datetime.fromisoformat(row[name])
    return row


class Segment:
    """A spool file held under an exclusive lock: ours to append to, or to replay."""

    def __init__(self, path: Path, handle: IO[bytes]):
        self.path = path
        self.handle = handle

    @classmethod
    def lock(cls, path: Path, create: bool = False) -> Segment | None:
        """The segment, locked; None when another process holds it (or it is gone)."""
        try:
            handle = open(path, "ab+" if create else "rb+")  # noqa: SIM115 - held open while locked
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        if not path.exists():  # deleted by its replayer between our open and our lock
            handle.close()
            return None
        return cls(path, handle)

    def read_all(self) -> list[dict[str, Any]]:
        """Every whole row in the file (a torn last line from a crash is skipped)."""
        self.handle.seek(0)
        rows = []
        for number, line in enumerate(self.handle, 1):
            if not line.strip():
                continue
            try:
                rows.append(decode(line))
            except ValueError:
                log.warning("audit spool %s line %d is not a whole row; skipped", self.path.name, number)
        return rows

    def close(self, delete: bool = False) -> None:
        """Release the lock (deleting the file first when asked)."""
        if delete:
            self.path.unlink(missing_ok=True)
        self.handle.close()


class AuditSpool:
    """Segment files of spooled rows under `directory`, at most `max_bytes` in all."""

    def __init__(self, directory: Path, max_bytes: int, name: str = ""):
        self.directory = directory
        self.max_bytes = max_bytes
        self.prefix = f"{_safe(name) or 'router'}-"
        self._current: Segment | None = None
        self._mutex = threading.Lock()  # appends and rotation run in worker threads
        self.directory.mkdir(parents=True, exist_ok=True)
        self.bytes = sum(p.stat().st_size for p in self._paths())
        self.refused = 0
        SPOOL_BYTES.set(self.bytes)

    def _paths(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def pending(self) -> bool:
        """Whether any segment (ours or another process's) is waiting."""
        return bool(self._paths())

    def append(self, rows: list[dict[str, Any]]) -> int:
        """Append rows durably (fsync'd); returns how many were kept (the rest: spool full)."""
        lines = [encode(r) for r in rows]
        with self._mutex:
            kept: list[bytes] = []
            size = self.bytes
            for line in lines:
                if size + len(line) > self.max_bytes:
                    break
                kept.append(line)
                size += len(line)
            refused = len(lines) - len(kept)
            if kept:
                if self._current is None:
                    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                    path = self.directory / f"{self.prefix}{stamp}-{uuid.uuid4().hex[:8]}{SUFFIX}"
                    self._current = Segment.lock(path, create=True)
                    assert self._current is not None, "a fresh segment name is ours alone"
                handle = self._current.handle
                handle.seek(0, os.SEEK_END)
                handle.write(b"".join(kept))
                handle.flush()
                os.fsync(handle.fileno())
                self.bytes = size
                SPOOLED.inc(len(kept))
                SPOOL_BYTES.set(self.bytes)
            self.refused += refused
            SPOOL_FULL.set(1 if refused else 0)
        return len(kept)

    def rotate(self) -> None:
        """Close the segment being appended to, so it can be replayed."""
        with self._mutex:
            if self._current is not None:
                self._current.close()
                self._current = None

    def take(self) -> Segment | None:
        """The oldest segment no process holds, locked for replay (ours rotated first)."""
        self.rotate()
        for path in self._paths():
            segment = Segment.lock(path)
            if segment is not None:
                return segment
        return None

    def set_aside(self, segment: Segment) -> Path:
        """Rename a segment Postgres refuses out of the replay (kept, for an operator)."""
        target = segment.path.with_suffix(".refused")
        size = segment.path.stat().st_size if segment.path.exists() else 0
        segment.path.rename(target)
        with self._mutex:
            self.bytes = max(0, self.bytes - size)
            SPOOL_BYTES.set(self.bytes)
        return target

    def done(self, segment: Segment, written: bool) -> None:
        """Delete a replayed segment (`written`), or just let it go for a later try."""
        size = segment.path.stat().st_size if written and segment.path.exists() else 0
        segment.close(delete=written)
        if written:
            with self._mutex:
                self.bytes = max(0, self.bytes - size)
                SPOOL_BYTES.set(self.bytes)
                SPOOL_FULL.set(0)

    def close(self) -> None:
        """Release the segment being appended to (its rows stay for the next start)."""
        self.rotate()


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:64]
