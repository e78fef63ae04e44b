"""The HTTP client library the gateway talks to engines with.

`httpx2` (pydantic's successor to httpx, same API) when installed: its connection pool
assigns requests in O(connections + requests), where httpx 0.28's pool rescans (and polls)
every idle connection for every request — with a hundred conversations in flight that scan
was the gateway's largest CPU cost. Plain `httpx` otherwise.
"""

from __future__ import annotations

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover - httpx2 is in requirements.lock
    import httpx  # type: ignore[no-redef]

__all__ = ["httpx"]
