"""The one listening-socket helper the gateway and the simulated engines share."""

from __future__ import annotations

import socket

import pytest
from boomerang_server.sockets import listen_socket


def test_port_zero_picks_a_free_port_and_the_socket_listens() -> None:
    sock = listen_socket("127.0.0.1:0", "gateway")
    try:
        host, port = sock.getsockname()[:2]
        assert (host, sock.getblocking()) == ("127.0.0.1", False) and port > 0
        with socket.create_connection((host, port), timeout=2):
            pass  # accepted into the backlog: it listens
    finally:
        sock.close()


def test_a_port_in_use_stops_the_command_with_one_line() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    try:
        with pytest.raises(SystemExit, match=rf"^boomerang sim: cannot listen on {address}: .*in use"):
            listen_socket(address, "sim")
    finally:
        taken.close()


def test_an_ipv6_address_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        sock = listen_socket("[::1]:0", "gateway")
    except SystemExit as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    assert sock.family == socket.AF_INET6
    sock.close()
