"""The solver contract: ``Solver.solve(instance, *, time_limit_s, gap_rel, threads, seed) -> Solution``.

Every exact oracle — per-tick assignment (PuLP/CBC, PuLP/HiGHS, CP-SAT, brute force) and the
clairvoyant multi-step schedule (CP-SAT, PuLP/CBC, PuLP/HiGHS) — returns a :class:`Solution`
whose ``objective`` is re-evaluated in numpy from the returned assignment (never read back from
the backend), so solvers agree to the token and the number means the same thing everywhere.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FEASIBLE",
    "NO_SOLUTION",
    "OPTIMAL",
    "Solution",
    "Solver",
    "modules_available",
    "relative_gap",
]

#: Proven optimal (within the requested ``gap_rel``).
OPTIMAL = "optimal"
#: An incumbent without a proof of optimality (the time limit was reached); ``bound`` and
#: ``gap`` say how far from optimal it can be.
FEASIBLE = "feasible"
#: The time limit was reached before any solution was found.
NO_SOLUTION = "no_solution"

Status = Literal["optimal", "feasible", "no_solution"]


def relative_gap(objective: float, bound: float) -> float:
    """``|objective − bound| / max(|objective|, 1)``: the solver-style relative gap (0 when
    proven optimal, ``inf`` without a bound)."""
    if not (math.isfinite(objective) and math.isfinite(bound)):
        return math.inf
    return abs(objective - bound) / max(abs(objective), 1.0)


@dataclass(slots=True, kw_only=True)
class Solution:
    """What a solver found.

    ``sense`` is ``"max"`` (per-tick F objective) or ``"min"`` (imbalance, step time).
    ``objective``: the exact value of the returned assignment (``nan`` without one);
    ``bound``: the best proven bound in the same sense (≥ objective for max, ≤ for min);
    ``gap``: :func:`relative_gap` of the two. ``replica[i]`` is the replica of request i (−1: not
    assigned this tick); ``start[i]`` its start step (clairvoyant only, decode steps).
    ``info`` carries solver-specific numbers (model objective under step coarsening, scales).
    """

    solver: str
    status: Status | str
    sense: Literal["max", "min"]
    objective: float
    bound: float
    wall_s: float
    replica: NDArray[np.int64]
    start: NDArray[np.int64] | None = None
    message: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative gap between ``objective`` and ``bound`` (0 when proven optimal)."""
        return relative_gap(self.objective, self.bound)

    @property
    def has_solution(self) -> bool:
        """True when an assignment was found (status optimal or feasible)."""
        return self.status in (OPTIMAL, FEASIBLE)


@runtime_checkable
class Solver(Protocol):
    """An exact oracle for one problem (``problem`` is ``"tick"`` or ``"clairvoyant"``).

    ``solve`` validates the instance (``ValueError`` naming what is wrong, including proven
    infeasibility), always honours ``time_limit_s``, stops at relative gap ``gap_rel``, uses at
    most ``threads`` threads and is deterministic for a given ``seed`` where the backend allows.
    Optional keywords every backend solver takes: ``params`` (backend parameters as
    ``{KEY: VALUE}`` texts, typed by the backend; a wrong key or type is a ``ValueError``),
    ``log_path`` (the backend's log goes to this file; nothing is printed) and ``export`` (a
    path stem: the model is written as ``<stem>.mps`` + ``<stem>.lp`` for PuLP backends or
    ``<stem>.cpsat.pb.txt`` for CP-SAT, objective in the instance's units with its constant).
    Clairvoyant solvers also take ``hint`` (a known schedule as a CP-SAT hint / MIP start).
    """

    name: ClassVar[str]
    problem: ClassVar[Literal["tick", "clairvoyant"]]
    requires: ClassVar[tuple[str, ...]]

    def solve(
        self, instance: Any, *, time_limit_s: float = 10.0, gap_rel: float = 0.0,
        threads: int = 1, seed: int = 0,
    ) -> Solution:
        """Solve ``instance`` (a :class:`TickInstance` or :class:`ClairvoyantInstance`)."""
        ...


def modules_available(*modules: str) -> bool:
    """True when every named module can be imported — checked with ``find_spec``, without
    importing the (heavy) backend."""
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def check_solve_args(time_limit_s: float, gap_rel: float, threads: int) -> None:
    """Validate the common keyword arguments of ``solve``."""
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"{time_limit_s=} must be a finite number > 0")
    if not 0.0 <= gap_rel < 1.0:
        raise ValueError(f"{gap_rel=} must be in [0, 1)")
    if threads < 1:
        raise ValueError(f"{threads=} must be >= 1")


class BackendSolver:
    """Mixin for solvers whose backend is an optional module: ``is_available()`` is true when
    every module in ``requires`` can be imported (checked without importing it)."""

    requires: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def is_available(cls) -> bool:
        """True when the backend's Python modules are installed (not imported)."""
        return modules_available(*cls.requires)
