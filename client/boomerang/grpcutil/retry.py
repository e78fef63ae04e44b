"""Client-side call options shared by Boomerang's typed clients."""

from __future__ import annotations

import json


# Retries only UNAVAILABLE, and clients enable it only for idempotent methods (every
# Boomerang RPC is idempotent by request id or natural key; see the protos).
def retry_service_config(service_names: list[str], max_attempts: int = 3) -> str:
    """A gRPC service config that retries UNAVAILABLE with backoff for these services."""
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": name} for name in service_names],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.05s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )
