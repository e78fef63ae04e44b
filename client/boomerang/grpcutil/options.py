"""gRPC channel options shared by servers (`server.py`) and clients (`channel.py`).

A module of its own so the client side, which the vLLM hook ships, does not import the
server's health and reflection services (and their distributions) to read six numbers.
"""

from __future__ import annotations


def grpc_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel options shared by servers and clients."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.http2.max_pings_without_data", 0),
        # Clients find a restarted service within seconds, not after gRPC's default
        # reconnect back-off of up to two minutes (servers ignore these).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
