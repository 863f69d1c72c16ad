"""Exact offline oracles next to the online heuristic: per-tick assignment (PuLP/CBC, PuLP/HiGHS,
CP-SAT, brute force), the clairvoyant multi-step schedule (CP-SAT, PuLP/CBC, PuLP/HiGHS), LP and
combinatorial lower bounds, and optimality-gap tooling.

``get_solver("tick-cpsat").solve(instance, time_limit_s=10)`` returns a :class:`Solution`; a
wrong name is answered with the valid ones. Backends are imported only when a solver runs.
``tick-pulp:NAME`` / ``clairvoyant-pulp:NAME`` run the MILPs on any solver PuLP knows
(``pulp.listSolvers()``: ``SCIP_PY``, ``GUROBI``, ``CPLEX_CMD``, ``GLPK_CMD``...) when installed.
"""

from __future__ import annotations

from typing import Any

from .base import FEASIBLE, NO_SOLUTION, OPTIMAL, Solution, Solver, modules_available
from .clairvoyant_cpsat import ClairvoyantCpSatSolver
from .clairvoyant_milp import ClairvoyantCbcSolver, ClairvoyantHighsSolver, ClairvoyantPulpSolver
from .instances import ClairvoyantInstance, TickInstance, load_instance, save_instance
from .tick_brute import TickBruteForceSolver
from .tick_cpsat import TickCpSatSolver
from .tick_pulp import TickCbcSolver, TickHighsSolver, TickPulpSolver

__all__ = [
    "FEASIBLE",
    "NO_SOLUTION",
    "OPTIMAL",
    "SOLVERS",
    "ClairvoyantInstance",
    "Solution",
    "Solver",
    "TickInstance",
    "available_solvers",
    "get_solver",
    "load_instance",
    "save_instance",
    "solver_names",
    "solver_problem",
]

SOLVERS: dict[str, Any] = {
    "tick-cbc": TickCbcSolver,
    "tick-highs": TickHighsSolver,
    "tick-cpsat": TickCpSatSolver,
    "tick-brute": TickBruteForceSolver,
    "clairvoyant-cpsat": ClairvoyantCpSatSolver,
    "clairvoyant-cbc": ClairvoyantCbcSolver,
    "clairvoyant-highs": ClairvoyantHighsSolver,
}


def solver_names(problem: str | None = None) -> list[str]:
    """Registered solver names (for one ``problem``, ``"tick"`` or ``"clairvoyant"``, if given)."""
    return [k for k, f in SOLVERS.items() if problem is None or f.problem == problem]  # type: ignore[attr-defined]


def available_solvers(problem: str | None = None) -> list[str]:
    """The registered solvers whose backend is installed."""
    return [k for k in solver_names(problem) if SOLVERS[k].is_available()]  # type: ignore[attr-defined]


#: ``<problem>-pulp:<PuLP solver name>`` builds one of these.
PULP_GENERIC: dict[str, Any] = {"tick": TickPulpSolver, "clairvoyant": ClairvoyantPulpSolver}


def get_solver(name: str) -> Solver:
    """The solver registered as ``name`` (or ``tick-pulp:NAME`` / ``clairvoyant-pulp:NAME``);
    ``ValueError`` listing the valid names otherwise, or naming the missing backend."""
    problem, sep, backend = name.partition("-pulp:")
    if sep and problem in PULP_GENERIC:
        from .pulp_backend import pulp_solver_available

        if not modules_available("pulp"):
            raise ValueError(f"solver {name!r} needs pulp: pip install '.[solvers]' in a clone of the repository")
        import pulp

        if backend not in pulp.listSolvers():
            raise ValueError(f"unknown PuLP solver {backend!r}; valid: {', '.join(pulp.listSolvers())}")
        if not pulp_solver_available(backend):
            raise ValueError(f"PuLP solver {backend!r} is not installed here; installed: "
                             f"{', '.join(pulp.listSolvers(onlyAvailable=True))}")
        return PULP_GENERIC[problem](backend)
    try:
        factory = SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}; valid: {', '.join(SOLVERS)}, "
                         "tick-pulp:<PuLP solver>, clairvoyant-pulp:<PuLP solver>") from None
    if not factory.is_available():  # type: ignore[attr-defined]
        raise ValueError(f"solver {name!r} needs {', '.join(factory.requires)}: "  # type: ignore[attr-defined]
                         "pip install '.[solvers]' in a clone of the repository")
    return factory()


def solver_problem(name: str) -> str:
    """``"tick"`` or ``"clairvoyant"`` for a solver name (registered or ``<problem>-pulp:NAME``);
    ``ValueError`` for an unknown name."""
    problem, sep, _ = name.partition("-pulp:")
    if sep and problem in PULP_GENERIC:
        return problem
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; valid: {', '.join(SOLVERS)}, "
                         "tick-pulp:<PuLP solver>, clairvoyant-pulp:<PuLP solver>")
    return SOLVERS[name].problem  # type: ignore[attr-defined, no-any-return]
