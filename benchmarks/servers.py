"""Local server processes shared by the proxy benchmark and the real-vLLM test: a free loopback
port, and waiting (bounded) until a server answers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable

import httpx

__all__ = ["free_port", "wait_http"]


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
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
