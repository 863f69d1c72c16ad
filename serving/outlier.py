"""Outlier detection for upstream hosts (decode replicas, prefill instances), after Envoy's
outlier detection and vllm-router's circuit breaker: fail small.

Evidence comes from two sources. *Passive*: results of real requests, attributed to a host only
when the host is to blame — a connection error at once, an HTTP/stream failure only once the same
request has succeeded on another host (a request that fails everywhere it goes is "poison" and
ejects nobody). *Active*: health probes, which flip a host down after
``probe_failure_threshold`` consecutive failed probes and up after ``probe_success_threshold``
consecutive passed ones (one slow probe never takes capacity away).

A host is ejected after ``consecutive_failures`` attributed failures in a row, or when its
failure share over the last ``window_s`` reaches ``failure_rate`` with at least
``min_requests`` results. The k-th ejection lasts ``min(k · base_ejection_s, max_ejection_s)``
(k resets after ``max_ejection_s`` without an ejection). Afterwards the host is on probation
(half-open): one attributed failure ejects it again, ``success_threshold`` successes close it.
No more than ``max_ejected_fraction`` of the hosts (at least one) are ejected at a time, and
when fewer than ``panic_threshold`` of the hosts are usable (ejected or probed down), every
host is used (panic mode), as Envoy does. No I/O here; the clock is injected.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import OutlierConfig

__all__ = ["OutlierConfig", "OutlierDetector"]


@dataclass(slots=True)
class _Host:
    probe_up: bool = True
    probe_streak: int = 0  # consecutive probe results against the current probe state
    consecutive: int = 0
    results: deque = field(default_factory=deque)  # (time, ok)
    ejected_until: float = 0.0
    ejections: int = 0
    last_ejection_end: float = -math.inf
    probation: bool = False
    probation_successes: int = 0


class OutlierDetector:
    """Ejection state of ``n`` hosts. ``on_change()`` is called whenever the usable set may have
    changed (an ejection, a probe flip); the caller re-reads :meth:`usable` and schedules
    :meth:`next_expiry` to re-read it when an ejection ends."""

    def __init__(self, n: int, config: OutlierConfig, *, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[], None] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.on_change = on_change
        self.hosts = [_Host() for _ in range(n)]
        self.ejections_total: dict[str, int] = {"consecutive": 0, "failure_rate": 0, "probation": 0}
        self.ejections_refused = 0

    # ------------------------------------------------------------------ evidence
    def record(self, host: int, ok: bool) -> str | None:
        """One attributed request result; returns the ejection reason if this ejected the host."""
        cfg, h, now = self.config, self.hosts[host], self.clock()
        self._settle(h, now)
        h.results.append((now, ok))
        while h.results and h.results[0][0] < now - cfg.window_s:
            h.results.popleft()
        if ok:
            h.consecutive = 0
            if h.probation:
                h.probation_successes += 1
                if h.probation_successes >= cfg.success_threshold:
                    h.probation = False
            return None
        h.consecutive += 1
        if self.ejected(host):
            return None
        reason = None
        if h.probation:
            reason = "probation"
        elif h.consecutive >= cfg.consecutive_failures:
            reason = "consecutive"
        elif len(h.results) >= cfg.min_requests:
            failures = sum(1 for _, good in h.results if not good)
            if failures >= cfg.failure_rate * len(h.results):
                reason = "failure_rate"
        if reason is None:
            return None
        return reason if self._eject(host, reason, now) else None

    def probe(self, host: int, ok: bool) -> bool:
        """One health-probe result; returns whether the host's probe state flipped."""
        cfg, h = self.config, self.hosts[host]
        if ok == h.probe_up:
            h.probe_streak = 0
            return False
        h.probe_streak += 1
        needed = cfg.probe_success_threshold if ok else cfg.probe_failure_threshold
        if h.probe_streak < needed:
            return False
        h.probe_up, h.probe_streak = ok, 0
        self._changed()
        return True

    # -------------------------------------------------------------------- views
    def ejected(self, host: int) -> bool:
        """Whether ``host`` is ejected now."""
        return self.hosts[host].ejected_until > self.clock()

    def usable(self, candidates: list[bool] | None = None) -> tuple[list[bool], bool]:
        """(per host: in service, panic) among ``candidates`` (default: every host; e.g. the
        ones not drained by hand). In panic every candidate is in service."""
        now = self.clock()
        cand = candidates if candidates is not None else [True] * len(self.hosts)
        ok = [c and h.probe_up and h.ejected_until <= now for c, h in zip(cand, self.hosts)]
        total = sum(cand)
        panic = total > 0 and sum(ok) < self.config.panic_threshold * total
        return (list(cand) if panic else ok), panic

    def next_expiry(self) -> float | None:
        """Seconds until the next ejection ends, if any host is ejected."""
        now = self.clock()
        ends = [h.ejected_until - now for h in self.hosts if h.ejected_until > now]
        return min(ends) if ends else None

    def state(self, host: int) -> dict[str, Any]:
        """The host's outlier state for ``/status``."""
        h, now = self.hosts[host], self.clock()
        return {"probe_up": h.probe_up, "ejected_for_s": max(0.0, h.ejected_until - now),
                "ejections": h.ejections, "probation": h.probation,
                "consecutive_failures": h.consecutive}

    # ----------------------------------------------------------------- internal
    def _settle(self, h: _Host, now: float) -> None:
        """An ejection that has ended puts the host on probation."""
        if h.ejected_until and h.ejected_until <= now:
            h.last_ejection_end = h.ejected_until
            h.ejected_until = 0.0
            h.probation, h.probation_successes, h.consecutive = True, 0, 0

    def _eject(self, host: int, reason: str, now: float) -> bool:
        cfg, h = self.config, self.hosts[host]
        ejected = sum(1 for other in self.hosts if other.ejected_until > now)
        if ejected + 1 > max(1, math.floor(cfg.max_ejected_fraction * len(self.hosts))):
            self.ejections_refused += 1
            return False
        if now - h.last_ejection_end > cfg.max_ejection_s:
            h.ejections = 0
        h.ejections += 1
        h.ejected_until = now + min(h.ejections * cfg.base_ejection_s, cfg.max_ejection_s)
        h.probation = False
        h.results.clear()
        self.ejections_total[reason] += 1
        self._changed()
        return True

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
