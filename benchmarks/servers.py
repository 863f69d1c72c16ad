"""Local server processes shared by the proxy benchmark and the real-vLLM test: a free loopback
port, and waiting (bounded) until a server answers."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Callable

import httpx

__all__ = ["free_port", "wait_http"]


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds and outgoing connections (Linux's default if unread)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago, drawn below the kernel's ephemeral
    range where there is room: a port the kernel hands out (an outgoing connection's, or a
    port-0 bind of vLLM's or UCX's) can take an ephemeral port between this check and the
    server's own bind — a NIXL side channel failed that way ("Address already in use") and its
    server never came up. Outside that range only another caller of this function can, one
    chance in about ten thousand per pair; else the kernel's choice, as before."""
    low, _ = _ephemeral_range()
    first = 20_000
    if low - first >= 1_000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(first, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, *, timeout: float = 30.0, proc: subprocess.Popen | None = None,
              interval: float = 0.1, context: Callable[[], str] = str) -> None:
    """Poll ``url`` until it answers 200; ``RuntimeError`` (with ``context()``, e.g. a log
    tail) when ``proc`` exits first or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}\n{context()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5.0).status_code == 200:
                return
        time.sleep(interval)
    raise RuntimeError(f"{url} not up after {timeout:.0f} s\n{context()}")
