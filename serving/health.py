"""Which decode replicas the policy may use: drained by hand, probed down, ejected by outlier
detection (:mod:`.outlier`), or all of them in panic mode; the health-probe and bootstrap loop;
the proxy's readiness.

A replica out of service has 0 free slots in the policy's state. When an ejection ends the
usable set is recomputed by a timer, so recovery does not wait for a probe round.

Readiness (``/health``, ``/health/ready``) is stricter than routing: panic mode routes to every
replica, but the proxy is ready only while some decode replica (and, with a prefill stage, some
prefill instance) is neither drained nor ejected and passed its latest conclusive probe — so the
round after the last replica goes, readiness fails. A probe is *inconclusive* (it changes
nothing) when it failed for the proxy's own reasons: it timed out while the proxy's event loop
lagged (:class:`LoopLag`: a timer ran late by more than a tenth of the probe timeout during the
probe), or the proxy was out of descriptors or buffers (:func:`local_error`). A busy proxy thus
cannot probe its replicas down.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import sys
import time
from collections import deque
from collections.abc import Callable

import httpx

from .config import ProxyConfig
from .dispatch import Dispatcher
from .http1 import LOCAL_ERRNOS, local_error
from .ledger import Ledger
from .metrics import ProxyMetrics
from .outlier import OutlierDetector
from .prefill import PrefillStage
from .protocol import upstream_headers

__all__ = ["LOCAL_ERRNOS", "LoopLag", "Membership", "local_error"]

log = logging.getLogger("balanceroute.serving.health")

STALL_S = 1.0  # a sample this late is a stall: logged at warning and counted
WATCHDOG_S = 10.0  # a loop blocked this long gets every thread's stack written to stderr
_watchdog_owner: object | None = None  # the sampler whose watchdog is armed (one per process)


class LoopLag:
    """How late the event loop runs a timer: every ``interval_s`` a sleep's overshoot is
    sampled (kept for ``keep_s``). :meth:`max_since` is what a probe result is judged against.

    It samples only while ``wanted()`` is true (default: always); otherwise it is *parked* —
    no timer, no sample, :attr:`last` 0 — until :meth:`wake`. The proxy wants it while a request
    is in flight, a probe round runs or probes are on (:class:`Membership`): the only times a
    timeout is judged against it. The first sample after a wake-up is how late the woken sampler
    ran, and :meth:`max_since` counts the wait for it, so a loop blocked right at the wake-up is
    seen.

    A sample later than ``stall_s`` is a *stall*: every stream and timer waited that long. It is
    logged at warning, counted (:attr:`stalls`) and passed to ``on_stall``. With ``watchdog_s``
    each sample also re-arms :func:`faulthandler.dump_traceback_later`, so a loop blocked that
    long (a call that never yields) gets every thread's stack written to stderr while it is
    still blocked: the stall names its cause. Parked, the watchdog is off. ``faulthandler`` has
    one such timer per process, so only the sampler that armed it last disarms it."""

    def __init__(self, interval_s: float = 0.05, keep_s: float = 60.0,
                 wanted: Callable[[], bool] | None = None, stall_s: float = STALL_S,
                 watchdog_s: float | None = None,
                 on_stall: Callable[[float], None] | None = None) -> None:
        self.interval_s = interval_s
        self.keep_s = keep_s
        self.wanted = wanted
        self.stall_s = stall_s
        self.watchdog_s = watchdog_s
        self.on_stall = on_stall
        self.stalls = 0
        self._armed = 0.0
        self.samples: deque[tuple[float, float]] = deque()  # (when sampled, lag)
        self.last = 0.0
        self.parked = False
        self._due = 0.0
        self._resume: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        """Sample until cancelled (parked while not wanted)."""
        loop = self._loop = asyncio.get_running_loop()
        resume = self._resume = asyncio.Event()
        try:
            while True:
                if self.wanted is not None and not self.wanted():
                    self._disarm()
                    self._due = 0.0  # nothing overdue while parked
                    self.last = 0.0
                    self.parked = True
                    try:
                        await resume.wait()
                    finally:
                        self.parked = False
                        resume.clear()
                    # _due: when wake() was called; this sample is how late the sampler ran
                else:
                    self._arm()
                    self._due = loop.time() + self.interval_s
                    await asyncio.sleep(self.interval_s)
                now = loop.time()
                self.last = max(0.0, now - self._due)
                self.samples.append((now, self.last))
                while self.samples and self.samples[0][0] < now - self.keep_s:
                    self.samples.popleft()
                if self.last > self.stall_s:
                    self._stalled(self.last)
        finally:
            self._disarm()

    def _stalled(self, lag: float) -> None:
        self.stalls += 1
        log.warning("the event loop ran %.1f s late: every stream, probe and timer waited that long "
                    "(the CPU was taken by other processes, or a call blocked the loop%s)", lag,
                    f"; one blocked over {self.watchdog_s:g} s writes its stack to stderr"
                    if self.watchdog_s else "")
        if self.on_stall is not None:
            self.on_stall(lag)

    def _arm(self) -> None:
        """(Re-)arm the watchdog once half its time has gone (faulthandler starts a thread per
        arming): a loop blocked for between ``watchdog_s``/2 and ``watchdog_s`` is dumped."""
        global _watchdog_owner
        if not self.watchdog_s:
            return
        now = time.monotonic()
        if _watchdog_owner is self and now - self._armed < 0.5 * self.watchdog_s:
            return
        try:
            faulthandler.dump_traceback_later(self.watchdog_s, file=sys.stderr)
        except (AttributeError, OSError, ValueError):  # stderr without a descriptor (captured)
            self.watchdog_s = None
            return
        _watchdog_owner, self._armed = self, now

    def _disarm(self) -> None:
        global _watchdog_owner
        if _watchdog_owner is self:
            faulthandler.cancel_dump_traceback_later()
            _watchdog_owner = None

    def wake(self) -> None:
        """Resume a parked sampler (called when it becomes wanted; a no-op otherwise)."""
        if self.parked and self._resume is not None and not self._resume.is_set():
            assert self._loop is not None
            self._due = self._loop.time()
            self._resume.set()

    def max_since(self, start: float) -> float:
        """The largest lag seen since loop time ``start`` (a sample still overdue counts)."""
        now = asyncio.get_running_loop().time()
        worst = max(0.0, now - self._due) if self._due else 0.0
        for when, lag in reversed(self.samples):
            if when < start:  # woke before the window: no overlap
                break
            worst = max(worst, lag)
        return worst

    def excuses(self, start: float, bound: float) -> bool:
        """Whether a timer of ``bound`` seconds that ran from loop time ``start`` and fired says
        nothing about the other side: the loop itself ran more than a tenth of the bound late
        meanwhile (the upstream's answer may have sat unread). The one rule for every timeout
        that would charge a host: probes, prefill attempts, decode connects, first tokens and
        mid-stream reads."""
        return self.max_since(start) > 0.1 * bound


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
        # the latest conclusive probe per decode replica / prefill instance (None: none yet)
        self.last_probe: list[bool | None] = [None] * config.num_replicas
        self.last_prefill_probe: list[bool | None] = [None] * len(config.prefill)
        self.inconclusive = 0  # probe results not counted (the proxy's own lag or resources)
        # loop lag is sampled while probes are on, a probe round runs or a request is in
        # flight (a timeout may then be judged against it); an idle proxy parks the sampler
        self._probing = 0
        self.lag = LoopLag(wanted=lambda: (config.health_interval_s > 0 or self._probing > 0
                                           or ledger.in_flight > 0),
                           watchdog_s=WATCHDOG_S, on_stall=lambda _lag: metrics.loop_stalls.inc())
        ledger.on_admit = self.lag.wake
        self._expiry: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self._lag_task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the probe/bootstrap loop and the loop-lag monitor (parked while idle with
        probes off)."""
        loop = asyncio.get_running_loop()
        self._lag_task = loop.create_task(self.lag.run(), name="balanceroute-loop-lag")
        self._task = loop.create_task(self._loop(), name="balanceroute-health")

    async def stop(self) -> None:
        """Stop the loop, the lag monitor and the ejection timer."""
        if self._expiry is not None:
            self._expiry.cancel()
        for task in (self._task, self._lag_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def decode_unready(self) -> str | None:
        """Why no decode replica can serve (``None``: at least one can); see the module doc."""
        n = self.config.num_replicas
        drained = sum(self.drained)
        ejected = sum(1 for g in range(n) if not self.drained[g] and self.outliers.ejected(g))
        failing = sum(1 for g in range(n) if not self.drained[g] and not self.outliers.ejected(g)
                      and self.last_probe[g] is False)
        if drained + ejected + failing < n:
            return None
        return (f"no decode replica in service: of {n}, {drained} drained, {ejected} ejected, "
                f"{failing} failing health probes")

    def prefill_unready(self) -> str | None:
        """Why no prefill instance can serve (``None``: at least one can)."""
        if not self.prefills.discovered:
            return "prefill DP ranks not discovered yet (bootstrap /query)"
        known = {t.index for t in self.prefills.targets}
        det = self.prefills.detector
        if any(not det.ejected(i) and self.last_prefill_probe[i] is not False for i in known):
            return None
        return f"no prefill instance in service: {len(self.config.prefill)} ejected or failing health probes"

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

    async def _probe(self, url: str, dp_rank: int | None, api_key: str | None) -> bool | None:
        """One probe: passed, failed, or ``None`` when the failure is the proxy's own (its loop
        lagged during a probe that timed out, or a local resource error)."""
        timeout = self.config.health_timeout_s
        start = asyncio.get_running_loop().time()
        try:
            resp = await self.client.get(url + "/health", headers=upstream_headers("health", dp_rank, api_key),
                                         timeout=timeout)
        except httpx.TimeoutException:
            return None if self.lag.excuses(start, timeout) else False
        except httpx.HTTPError as exc:
            return None if local_error(exc) else False
        except OSError as exc:
            if local_error(exc):
                return None
            raise
        return resp.status_code == 200

    async def probe_all(self) -> None:
        """One round of health probes (decode replicas and prefill instances); inconclusive
        results change nothing."""
        cfg = self.config
        decode = [self._probe(d.url, d.dp_rank, d.api_key()) for d in cfg.decode]
        prefill = [self._probe(p.url, None, p.api_key()) for p in cfg.prefill]
        self._probing += 1  # a timed-out probe is judged against the loop lag: sample it
        self.lag.wake()
        try:
            results = await asyncio.gather(*decode, *prefill)
        finally:
            self._probing -= 1
        skipped = sum(1 for ok in results if ok is None)
        if skipped:
            self.inconclusive += skipped
            log.info("%d health probe(s) inconclusive (proxy loop lag %.2f s, or out of descriptors): "
                     "not counted", skipped, self.lag.last)
        for g, ok in enumerate(results[: len(decode)]):
            if ok is None:
                continue
            self.last_probe[g] = ok
            if self.outliers.probe(g, ok):
                log.warning("decode replica %d is %s (health probes)", g, "back" if ok else "down")
        for i, ok in enumerate(results[len(decode):]):
            if ok is None:
                continue
            self.last_prefill_probe[i] = ok
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
