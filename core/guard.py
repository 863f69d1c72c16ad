"""An online guard for a lookahead: a selection between BR-0 and the lookahead by realised cost.

Derivation and bound: ``papers/guard.md``. The guard cuts the run into blocks of ``block_steps``
steps of the state's clock (decode steps in the simulator, ticks in the proxy). One block in
every ``probe_every`` is played by the arm that is not the *incumbent* (BR-0 at the start), the
others by the incumbent. The probe block and its neighbour (before it in even groups, after it
in odd ones: A B / B A, so a linear trend cancels over two pairs) form a *pair*; a pair's
observation is the difference of the two blocks' realised idle fractions

    ``x = ΣI/ΣG·M (lookahead block) − ΣI/ΣG·M (BR-0 block)``,

with ``I(k) = G·M(k) − Σ_g L_g(k)`` the barrier imbalance the step runs on (the loads right after
the tick, grown by one token per running request per step until the next tick: exact while no
request leaves between two ticks, which in the simulator holds whenever the pool is not empty).

Rules, after each pair (n pairs, mean x̄, standard deviation s, half-width
t·s/√n with t Student's quantile at ``level`` for n − 1 degrees of freedom):

- the lookahead becomes the incumbent only when n ≥ ``min_pairs`` and x̄ + t·s/√n < 0 (proved
  better); it stops being the incumbent as soon as x̄ ≥ 0 (hysteresis: proved to enter, merely
  doubtful to leave);
- when n ≥ ``min_pairs`` and x̄ − t·s/√n > 0 (proved worse), or when BR-0 is the incumbent and
  ``max_probes`` probe blocks have been granted, the guard *locks*: BR-0 decides every tick
  after.

So the lookahead decides, while it is not proved better, at most one block in ``probe_every``
and at most ``max_probes`` blocks in all: its excess over BR-0 is bounded by that share of its
per-step excess (``papers/guard.md``, "The bound").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

__all__ = ["BR0_ARM", "LOOKAHEAD_ARM", "GuardLedger", "OnlineGuard", "t_quantile"]

BR0_ARM = 0
"""The arm that places by BR-0's tick."""
LOOKAHEAD_ARM = 1
"""The arm that places by the lookahead's own tick."""

_CREDIT_CAP = 256  # steps of one gap whose imbalance is computed exactly; the rest hold the last


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``t_p(df)`` from the normal one by its Cornish–Fisher expansion
    (Abramowitz & Stegun 26.7.5): at p = 0.975 within 3e-4 of the exact value for df ≥ 5 and
    1e-4 for df ≥ 9 (no SciPy needed; a test checks table values)."""
    if df < 1 or not 0.5 <= p < 1:
        raise ValueError(f"{df=} must be >= 1 and {p=} in [0.5, 1)")
    z = NormalDist().inv_cdf(p)
    g = ((z**3 + z) / 4,
         (5 * z**5 + 16 * z**3 + 3 * z) / 96,
         (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
         (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineGuard:
    """The guard's constants (module docstring). ``block_steps`` W: steps of one block;
    ``probe_every`` m ≥ 2: one block in m is the other arm's; ``min_pairs``: pairs before any
    verdict; ``level``: the confidence level of the verdicts; ``max_probes``: probe blocks BR-0
    grants an unproved lookahead before it locks (``None``: no cap)."""

    block_steps: int = 64
    probe_every: int = 8
    min_pairs: int = 4
    level: float = 0.95
    max_probes: int | None = 32

    def __post_init__(self) -> None:
        if int(self.block_steps) != self.block_steps or self.block_steps < 1:
            raise ValueError(f"{self.block_steps=} must be an integer >= 1")
        if int(self.probe_every) != self.probe_every or self.probe_every < 2:
            raise ValueError(f"{self.probe_every=} must be an integer >= 2")
        if int(self.min_pairs) != self.min_pairs or self.min_pairs < 2:
            raise ValueError(f"{self.min_pairs=} must be an integer >= 2")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"{self.level=} must be in (0, 1)")
        if self.max_probes is not None and (int(self.max_probes) != self.max_probes
                                            or self.max_probes < 1):
            raise ValueError(f"{self.max_probes=} must be an integer >= 1 (or None: no cap)")


@dataclass(slots=True)
class GuardLedger:
    """The guard's running record for one run (:class:`OnlineGuard`'s rules). Per tick: call
    :meth:`arm` with the state's step before deciding, then :meth:`observe` with the loads and
    running counts right after the decision. A step smaller than the last one seen starts a new
    run (the record is cleared)."""

    config: OnlineGuard = field(default_factory=OnlineGuard)
    incumbent: int = BR0_ARM
    locked: bool = False
    pairs: list[float] = field(default_factory=list)
    probes_unproved: int = 0
    lookahead_steps: int = 0
    switches: int = 0
    _block: int = -1
    _block_arm: int = BR0_ARM
    _cost: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σ I, Σ G·M of the block
    _pending: tuple[int, int, float] | None = None  # (group, arm, idle fraction) of a pair's half
    _last: tuple[int, NDArray, NDArray] | None = None  # (step, loads, active) of the last tick

    def reset(self) -> None:
        """Forget the run (a new run starts)."""
        self.incumbent, self.locked, self.pairs = BR0_ARM, False, []
        self.probes_unproved = self.lookahead_steps = self.switches = 0
        self._block, self._block_arm, self._cost = -1, BR0_ARM, [0.0, 0.0]
        self._pending = self._last = None

    def _roles(self, block: int) -> tuple[int, tuple[int, int]]:
        """Position of the probe block in ``block``'s group, and the pair's two positions."""
        m = self.config.probe_every
        if (block // m) % 2 == 0:
            return 1, (0, 1)
        return m - 2, (m - 2, m - 1)

    def arm(self, step: int) -> int:
        """The arm that decides the tick at ``step`` (:data:`BR0_ARM` or :data:`LOOKAHEAD_ARM`)."""
        if self._last is not None and step < self._last[0]:
            self.reset()
        self._credit(step)
        block = step // self.config.block_steps
        if block != self._block:
            if self._block >= 0:
                self._close()
            self._block, self._cost = block, [0.0, 0.0]
            probe, _ = self._roles(block)
            chosen = self.incumbent
            if block % self.config.probe_every == probe:
                chosen = LOOKAHEAD_ARM if self.incumbent == BR0_ARM else BR0_ARM
            if chosen == LOOKAHEAD_ARM and self.incumbent == BR0_ARM:  # an unproved probe
                cap = self.config.max_probes
                if cap is not None and self.probes_unproved >= cap:
                    self.locked = True
                else:
                    self.probes_unproved += 1
            self._block_arm = BR0_ARM if self.locked else chosen
        return self._block_arm

    def observe(self, step: int, loads: NDArray, active: NDArray) -> None:
        """The loads L_g and running counts n_g the step at ``step`` runs on (after the tick)."""
        self._last = (int(step), np.asarray(loads, dtype=np.float64).copy(),
                      np.asarray(active, dtype=np.float64).copy())

    def _credit(self, step: int) -> None:
        """Charge the steps since the last tick to the current block: I and G·M of the loads
        after that tick, grown by n_g per step (held after :data:`_CREDIT_CAP` steps)."""
        if self._last is None or step <= self._last[0]:
            return
        k0, loads, active = self._last
        gap = step - k0
        j = np.arange(min(gap, _CREDIT_CAP), dtype=np.float64)
        grown = loads[:, None] + active[:, None] * j[None, :]
        gm = loads.shape[0] * grown.max(axis=0)
        imb = gm - grown.sum(axis=0)
        weight = np.ones(j.shape[0])
        weight[-1] += gap - j.shape[0]
        self._cost[0] += float(imb @ weight)
        self._cost[1] += float(gm @ weight)
        if self._block_arm == LOOKAHEAD_ARM:
            self.lookahead_steps += gap
        self._last = (step, loads, active)

    def _close(self) -> None:
        """The current block ends: a pair's half waits for its partner; a whole pair is judged."""
        _, pair = self._roles(self._block)
        group, pos = divmod(self._block, self.config.probe_every)
        sum_i, sum_gm = self._cost
        if pos not in pair or sum_gm <= 0:
            return
        idle = sum_i / sum_gm
        if pos == pair[0]:
            self._pending = (group, self._block_arm, idle)
            return
        half, self._pending = self._pending, None
        if half is None or half[0] != group or half[1] == self._block_arm or self.locked:
            return
        x = idle - half[2] if self._block_arm == LOOKAHEAD_ARM else half[2] - idle
        self._judge(x)

    def _judge(self, x: float) -> None:
        """Add one pair's difference and apply the rules (module docstring)."""
        cfg = self.config
        self.pairs.append(x)
        n = len(self.pairs)
        mean = float(np.mean(self.pairs))
        half = (t_quantile(0.5 + cfg.level / 2, n - 1) * float(np.std(self.pairs, ddof=1))
                / math.sqrt(n) if n > 1 else math.inf)
        if n >= cfg.min_pairs and mean - half > 0:
            self.locked, self.incumbent = True, BR0_ARM
        elif self.incumbent == BR0_ARM and n >= cfg.min_pairs and mean + half < 0:
            self.incumbent = LOOKAHEAD_ARM
            self.switches += 1
        elif self.incumbent == LOOKAHEAD_ARM and mean >= 0:
            self.incumbent = BR0_ARM
            self.switches += 1
