"""Each decode replica's step model, fitted online from the inter-token intervals the proxy relays.

The policies decide on step time τ_g = b_g + a_g·L_g + c_g·n_g; the proxy sees only
the intervals between the tokens it relays. In a lock-stepped DP group every stream sees the same
interval, the *barrier* step max_g τ_g, so one replica's streams do not measure that replica. An
interval y, with the loads the ledger holds for every replica at that moment, bounds every
replica's τ_g from above and equals it for the replica that is the envelope: so each replica's
line is fitted by attribution (max-affine regression, as in Magnani & Boyd's convex
piecewise-linear fitting): the line the fit names the envelope moves toward y, every line the
fit puts above y comes down to it (normalised least-mean-squares steps, ``rate``), and each a_g
is pulled toward the prior by ``shrink`` per observation; the intercept b —
the shared collective cost of a lock-stepped step, not identifiable per replica from barrier
intervals — held at the prior's. Without lock-step (``lockstep=False``: independent servers) an
interval measures its own replica, and (a_g, b_g) is a ridge regression toward the prior (worth
``prior_weight`` observations at a load of ``scale_tokens``) with exponential forgetting
(``forget`` per observation).

Noise is bounded: an interval is clipped to [1/``clip``, ``clip``]× the fit's prediction before
it counts (a client stall or a GC pause moves the fit by a bounded step), and the fitted a_g,
b_g stay within [1/``max_ratio``, ``max_ratio``]× the prior. ``c`` is the prior's (the intervals
barely tell c from a).

Known limit (measured on a live emulator, docs/replicas.md): on lock-stepped ranks the
attribution can settle on the wrong rank — in closed loop, and also while the policy balances
tokens — so the fit is off unless configured (``speed_fit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from balanceroute.core.dynamics import StepModel

__all__ = ["SpeedFit", "TokenClock"]


@dataclass(slots=True, kw_only=True)
class SpeedFit:
    """Online per-replica (a_g, b_g) with a prior and bounded noise (module docstring).

    ``observe(replica, interval_s, load_tokens, running)`` after each relayed token (interval per
    token; the load and running count the ledger holds for that replica); ``coefficients()`` gives
    the (a, b, c) arrays the tick reads; ``snapshot()`` what ``/status`` and ``/metrics`` show.
    """

    num_replicas: int
    prior: StepModel = field(default_factory=StepModel)
    prior_weight: float = 50.0
    scale_tokens: float = 100_000.0
    forget: float = 0.999
    clip: float = 2.0
    max_ratio: float = 4.0
    lockstep: bool = True
    rate: float = 0.002
    shrink: float = 1e-4
    observations: NDArray[np.int64] = field(init=False)
    _s: NDArray[np.float64] = field(init=False)  # per replica: Σw, Σx, Σy, Σxx, Σxy
    _loads: NDArray[np.float64] = field(init=False)
    _running: NDArray[np.float64] = field(init=False)
    _a: NDArray[np.float64] = field(init=False)
    _b: NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"{self.num_replicas=} must be >= 1")
        if not (self.prior.a > 0 and self.prior.b > 0):
            raise ValueError(f"{self.prior=} must have a > 0 and b > 0")
        if not (0 < self.forget <= 1 and self.clip > 1 and self.max_ratio > 1
                and self.prior_weight > 0 and self.scale_tokens > 0):
            raise ValueError("forget must be in (0, 1], clip and max_ratio > 1, prior_weight and "
                             "scale_tokens > 0")
        g = self.num_replicas
        self.observations = np.zeros(g, dtype=np.int64)
        self._s = np.zeros((g, 5))
        self._loads = np.zeros(g)
        self._running = np.zeros(g)
        self._a = np.full(g, self.prior.a)
        self._b = np.full(g, self.prior.b)

    def predicted(self) -> NDArray[np.float64]:
        """τ̂_g at the loads last seen."""
        return self._b + self._a * self._loads + self.prior.c * self._running

    def observe(self, replica: int, interval_s: float, load_tokens: float, running: int) -> None:
        """One relayed inter-token interval (seconds per token) of a stream on ``replica``, whose
        ledger load and running count were ``load_tokens`` and ``running``."""
        if not (interval_s > 0 and np.isfinite(interval_s)) or not 0 <= replica < self.num_replicas:
            return
        self._loads[replica] = float(load_tokens)
        self._running[replica] = float(running)
        tau = self.predicted()
        self.observations[replica] += 1
        if self.lockstep:  # every replica seen: y bounds its τ_g from above (lower quantile)
            top = float(tau.max())
            y = min(max(interval_s, top / self.clip), top * self.clip)
            seen = self.observations > 0
            x = self._loads / self.scale_tokens
            err = (y - tau) / self.prior.b  # relative to the step's fixed part
            # the envelope's line moves to y; every other line the fit puts above y comes down
            move = seen & ((tau == tau[seen].max()) | (err < 0))
            self._a[move] += (self.rate * err * x)[move] * self.prior.b / self.scale_tokens
            self._a += self.shrink * (self.prior.a - self._a)
            r = self.max_ratio
            np.clip(self._a, self.prior.a / r, self.prior.a * r, out=self._a)
            return
        y = min(max(interval_s, tau[replica] / self.clip), tau[replica] * self.clip)
        self._update(int(replica), self._loads[replica], y - self.prior.c * self._running[replica])

    def _update(self, g: int, x: float, y: float) -> None:
        s = self._s[g]
        s *= self.forget
        s += (1.0, x, y, x * x, x * y)
        # ridge toward the prior: λ_b (b − b0)² + λ_a (a − a0)², λ_a = λ_b·scale²
        lam_b = self.prior_weight
        lam_a = self.prior_weight * self.scale_tokens ** 2
        m = np.array([[s[0] + lam_b, s[1]], [s[1], s[3] + lam_a]])
        v = np.array([s[2] + lam_b * self.prior.b, s[4] + lam_a * self.prior.a])
        b, a = np.linalg.solve(m, v)
        r = self.max_ratio
        self._a[g] = min(max(a, self.prior.a / r), self.prior.a * r)
        self._b[g] = min(max(b, self.prior.b / r), self.prior.b * r)

    def coefficients(self, now: float | None = None) -> tuple[NDArray, NDArray, NDArray]:
        """(a, b, c), one entry per replica: what ``ClusterState.step_a/b/c`` take."""
        return self._a.copy(), self._b.copy(), np.full(self.num_replicas, self.prior.c)

    def snapshot(self) -> list[dict[str, float]]:
        """Per replica: the fitted a (µs per KV token), b (ms), observations counted."""
        return [{"replica": g, "step_a_us_per_token": float(self._a[g] * 1e6),
                 "step_b_ms": float(self._b[g] * 1e3), "observations": int(self.observations[g])}
                for g in range(self.num_replicas)]


class TokenClock:
    """Per stream, the time of its last relayed token: :meth:`interval` turns a progress report
    (a_i grew to ``tokens`` at ``now``) into seconds per token since the previous one (``None``
    for a stream's first report). Remembers at most ``capacity`` streams (the oldest forgotten)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._last: dict[int, tuple[int, float]] = {}

    def interval(self, stream: int, tokens: int, now: float) -> float | None:
        """Seconds per token since the stream's previous report, or ``None``."""
        prev = self._last.pop(stream, None)
        self._last[stream] = (tokens, now)
        if len(self._last) > self.capacity:
            del self._last[next(iter(self._last))]
        if prev is None or tokens <= prev[0] or now <= prev[1]:
            return None
        return (now - prev[1]) / (tokens - prev[0])
