"""Which decode replicas the policy may use: drained by hand, probed down, ejected by outlier
detection (:mod:`.outlier`), or all of them in panic mode; the health-probe and bootstrap loop.

A replica out of service has 0 free slots in the policy's state. When an ejection ends the
usable set is recomputed by a timer, so recovery does not wait for a probe round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx

from .config import ProxyConfig
from .dispatch import Dispatcher
from .ledger import Ledger
from .metrics import ProxyMetrics
from .outlier import OutlierDetector
from .prefill import PrefillStage
from .protocol import upstream_headers

__all__ = ["Membership"]

log = logging.getLogger("balanceroute.serving.health")


class Membership:
    """Decode replicas' service state (``outliers``, ``drained``, ``panic``) and the probes."""

    def __init__(self, config: ProxyConfig, client: httpx.AsyncClient, ledger: Ledger,
                 dispatcher: Dispatcher, prefills: PrefillStage, metrics: ProxyMetrics) -> None:
        self.config = config
        self.client = client
        self.ledger = ledger
        self.dispatcher = dispatcher
        self.prefills = prefills
        self.metrics = metrics
        self.outliers = OutlierDetector(config.num_replicas, config.outlier, on_change=self.refresh)
        self.drained = [False] * config.num_replicas
        self.panic = False
        self._expiry: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the probe/bootstrap loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="balanceroute-health")

    async def stop(self) -> None:
        """Stop the loop and the ejection timer."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def record(self, g: int, ok: bool) -> None:
        """An attributed request result of replica ``g``."""
        reason = self.outliers.record(g, ok)
        if reason is not None:
            self.metrics.ejections.labels("decode", reason).inc()
            log.warning("decode replica %d ejected (%s) for %.0f s", g, reason,
                        self.outliers.hosts[g].ejected_until - time.monotonic())

    def set_drained(self, g: int, drained: bool) -> None:
        """Admin: take replica ``g`` out of service (no new requests) or put it back."""
        self.drained[g] = drained
        self.refresh()

    def refresh(self) -> None:
        """Recompute the usable replicas and re-run when the next ejection ends."""
        usable, panic = self.outliers.usable([not d for d in self.drained])
        if panic != self.panic:
            log.warning("panic mode %s: routing to %d of %d replicas", "on" if panic else "off",
                        sum(usable), len(usable))
        self.panic = panic
        for g, ok in enumerate(usable):
            self.ledger.set_available(g, ok)
        self.dispatcher.wake()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        wait = self.outliers.next_expiry()
        if wait is not None:
            self._expiry = asyncio.get_running_loop().call_later(wait + 1e-3, self.refresh)

    async def _probe(self, url: str, dp_rank: int | None, api_key: str | None) -> bool:
        try:
            resp = await self.client.get(url + "/health", headers=upstream_headers("health", dp_rank, api_key),
                                         timeout=self.config.health_timeout_s)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def probe_all(self) -> None:
        """One round of health probes (decode replicas and prefill instances)."""
        cfg = self.config
        decode = [self._probe(d.url, d.dp_rank, d.api_key()) for d in cfg.decode]
        prefill = [self._probe(p.url, None, p.api_key()) for p in cfg.prefill]
        results = await asyncio.gather(*decode, *prefill)
        for g, ok in enumerate(results[: len(decode)]):
            if self.outliers.probe(g, ok):
                log.warning("decode replica %d is %s (health probes)", g, "back" if ok else "down")
        for i, ok in enumerate(results[len(decode):]):
            if self.prefills.detector.probe(i, ok):
                log.warning("prefill instance %d is %s (health probes)", i, "back" if ok else "down")

    async def _loop(self) -> None:
        interval = self.config.health_interval_s
        while True:
            try:
                if not self.prefills.discovered:
                    await self.prefills.discover()
                if interval > 0:
                    await self.probe_all()
            except Exception:  # keep probing whatever happens
                log.exception("health probe round failed")
            if interval <= 0 and self.prefills.discovered:
                return
            await asyncio.sleep(interval if interval > 0 else 1.0)
