"""The proxy's graceful drain on SIGTERM (Kubernetes probe conventions, Envoy's drain).

The server has already closed its listener and its idle connections (:func:`.runner.serve_apps`)
when :func:`drain` starts. Then:

1. readiness fails at once (``/health`` and ``/health/ready`` answer 503 ``draining``), and a
   request that still arrives on an open connection gets 503 ``shutting_down`` + ``Retry-After``;
2. in-flight requests — streaming, pooled, prefilling — go on for up to ``grace_s``;
3. then every open stream ends with an OpenAI-style error event and ``data: [DONE]`` and every
   request not answered yet (pooled, prefilling, a non-streamed one being assembled) gets 503
   ``shutting_down``: never silence;
4. the server closes what is left and the process exits 0.

Each phase is logged at warning (start, grace over) or info (done).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol


class Drainable(Protocol):
    """What the drain reads and sets on the proxy (:class:`.proxy.Proxy`)."""

    draining: bool
    stopping: bool
    ledger: Any
    open_relays: dict[Any, Any]
    unanswered: dict[Any, Any]

__all__ = ["drain"]

log = logging.getLogger("balanceroute.serving.drain")


async def drain(proxy: Drainable, grace_s: float, *, poll_s: float = 0.05, settle_s: float = 2.0) -> None:
    """Drain ``proxy`` within ``grace_s`` (see the module docstring); ``settle_s`` bounds the wait
    for the ended requests' accounting."""
    t0 = time.monotonic()
    proxy.draining = True
    led = proxy.ledger
    log.warning("drain: readiness fails from now, no new connections; %d request(s) in flight "
                "(%d streaming); grace %.1f s", led.in_flight, len(proxy.open_relays), grace_s)
    deadline = t0 + grace_s
    while led.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
    if not led.in_flight:
        log.info("drain: every in-flight request finished, %.1f s after the signal", time.monotonic() - t0)
        return
    relays, waiting = list(proxy.open_relays.values()), list(proxy.unanswered.values())
    log.warning("drain: grace of %.1f s over: ending %d stream(s) with an error event, answering %d "
                "request(s) not yet answered with 503", grace_s, len(relays), len(waiting))
    proxy.stopping = True
    for relay in relays:
        relay.shutdown()
    for task in waiting:
        task.cancel()
    end = time.monotonic() + settle_s
    while led.in_flight and time.monotonic() < end:
        await asyncio.sleep(poll_s / 5)
    if led.in_flight:
        log.warning("drain: %d request(s) still open after the grace; their connections close now",
                    led.in_flight)
    else:
        log.info("drain: done, %.1f s after the signal", time.monotonic() - t0)
