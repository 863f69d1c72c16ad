"""``benchmarks.servers.free_port``: the port a test server will bind is drawn below the kernel's
ephemeral range, where no outgoing connection or port-0 bind of another process (vLLM's NIXL
side channel lost its port that way) can take it first; and it is free."""

from __future__ import annotations

import socket

from benchmarks.servers import _ephemeral_range, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low, high = _ephemeral_range()
    assert 0 < low <= high
    for _ in range(20):
        port = free_port()
        if low - 20_000 >= 1_000:
            assert 20_000 <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free a moment later too
