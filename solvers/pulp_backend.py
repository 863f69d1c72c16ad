"""Running a PuLP model on CBC, HiGHS or any other PuLP solver with a time limit, and reading back
status and bound.

Shared by the per-tick and clairvoyant MILPs; the models themselves live in their own modules.
``backend`` is ``"cbc"`` (CBC through PuLP's ``COIN_CMD``: the ``cbcbox`` package's binary, a
``cbc`` on the PATH, or the one PuLP 3 bundles; :func:`cbc_path`), ``"highs"`` (PuLP's in-process
``HiGHS`` on ``highspy``) or any name of ``pulp.listSolvers()`` (``SCIP_PY``, ``GUROBI``,
``CPLEX_CMD``, ...: a solver PuLP finds installed). A MIP start (``warm_start``), solver
parameters (``params``, ``KEY=VALUE`` strings typed by the backend) and a log file
(``log_path``) are passed through where the backend supports them.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import FEASIBLE, NO_SOLUTION, OPTIMAL

__all__ = ["PULP_BACKENDS", "AnyPulpBackend", "cbc_path", "export_pulp", "pulp_solver_available",
           "reset_highs_threads", "solve_pulp"]

#: Python modules each named PuLP backend needs (``highspy`` for PuLP's in-process ``HiGHS``).
PULP_BACKENDS: dict[str, tuple[str, ...]] = {"cbc": ("pulp",), "highs": ("pulp", "highspy")}

_CBC_BOUND = re.compile(r"^(?:Lower|Upper) bound:\s+(\S+)", re.MULTILINE)


class AnyPulpBackend:
    """Mixin for a PuLP model solver whose backend is chosen at construction: any
    ``pulp.listSolvers()`` name; the solver is then named ``<problem>-pulp:<backend>``."""

    problem: str
    requires: tuple[str, ...] = ("pulp",)

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.name = f"{self.problem}-pulp:{backend}"


def cbc_path() -> str | None:
    """The CBC binary ``COIN_CMD`` runs: the ``cbcbox`` package's (PuLP's ``cbc`` extra, the
    way PuLP 4 ships CBC), else ``cbc`` on the PATH, else the binary PuLP 3 bundles (the one its
    deprecated ``PULP_CBC_CMD`` runs); ``None`` when there is none."""
    from .base import modules_available

    if modules_available("cbcbox"):
        import cbcbox

        path = cbcbox.cbc_bin_path()
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("cbc")
    if found:
        return found
    if modules_available("pulp"):
        from pulp.apis import coin_api

        bundled = getattr(coin_api, "pulp_cbc_path", None)
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    return None


def pulp_solver_available(name: str) -> bool:
    """True when PuLP can run the solver ``name`` (``cbc``, ``highs`` or a ``pulp.listSolvers()``
    name) on this machine."""
    from .base import modules_available

    if name in PULP_BACKENDS:
        return modules_available(*PULP_BACKENDS[name]) and (name != "cbc" or cbc_path() is not None)
    if not modules_available("pulp"):
        return False
    import pulp

    return name in pulp.listSolvers(onlyAvailable=True)


def export_pulp(prob: Any, stem: str, *, scale: float = 1.0, constant: float = 0.0) -> list[str]:
    """Write ``prob`` as ``<stem>.mps`` and ``<stem>.lp`` with the objective in the instance's own
    units (scale × the model's objective + constant, the constant included); ``prob`` itself is
    left unchanged. Returns the paths."""
    import pulp

    saved = prob.objective
    prob.objective = pulp.LpAffineExpression(
        [(v, scale * c) for v, c in saved.items()], constant=scale * saved.constant + constant)
    try:
        paths = [f"{stem}.mps", f"{stem}.lp"]
        prob.writeMPS(paths[0])
        prob.writeLP(paths[1])
        offset = float(prob.objective.constant)
    finally:
        prob.objective = saved
    mps = Path(paths[0]).read_text().splitlines()
    if prob.sense == pulp.LpMaximize and "OBJSENSE" not in mps:
        # PuLP marks the sense only in a comment; OBJSENSE MAX is read by HiGHS, CPLEX,
        # Gurobi and SCIP.
        at = next(k for k, t in enumerate(mps) if t.startswith("NAME")) + 1
        mps[at:at] = ["OBJSENSE", "    MAX"]
    if offset:  # PuLP drops the objective constant from both formats: add it back
        # MPS convention (CPLEX, Gurobi, HiGHS, SCIP): RHS of the objective row = −constant.
        line = f"    RHS       OBJ       {-offset: .12e}"
        if "RHS" in mps:
            mps.insert(mps.index("RHS") + 1, line)
        else:
            at = next(k for k, t in enumerate(mps) if t in ("BOUNDS", "RANGES", "ENDATA"))
            mps[at:at] = ["RHS", line]
        lp = Path(paths[1]).read_text().splitlines()
        at = lp.index("Subject To")
        lp.insert(at, f" {'+' if offset > 0 else '-'} {abs(offset):.12g}")
        Path(paths[1]).write_text("\n".join(lp) + "\n")
    Path(paths[0]).write_text("\n".join(mps) + "\n")
    return paths


def _typed(value: str) -> Any:
    """``"1"`` → 1, ``"0.5"`` → 0.5, ``"true"`` → True; anything else stays a string."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def solve_pulp(
    prob: Any, backend: str, *, time_limit_s: float, gap_rel: float, threads: int, seed: int,
    warm_start: Mapping[Any, float] | None = None, params: Mapping[str, str] | None = None,
    log_path: str | None = None,
) -> tuple[str, float, str]:
    """Solve ``prob`` in place; return ``(status, best_bound, message)``.

    The objective must have no constant term (HiGHS is not given it): callers add constants
    themselves. ``status`` is ``optimal`` (proven within ``gap_rel``), ``feasible`` (time limit with an
    incumbent) or ``no_solution``; ``best_bound`` is in the model's own sense (``nan`` if the
    backend did not report one). ``warm_start`` maps PuLP variables to start values (variables
    left out start at 0). Raises ``ValueError`` if the model is proven infeasible or a solver
    parameter is rejected, ``RuntimeError`` if the backend fails.
    """
    import pulp

    params = dict(params or {})
    if backend == "PULP_CBC_CMD":  # deprecated in PuLP 3, gone in 4: the same CBC via COIN_CMD
        backend = "cbc"
    if warm_start:
        for var in prob.variables():
            var.setInitialValue(float(warm_start.get(var, 0.0)))
    if backend == "cbc":
        path = cbc_path()
        if path is None:
            raise ValueError("no CBC binary: install PuLP's cbc extra (cbcbox) or put cbc on the PATH")
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(log_path) if log_path else Path(tmp) / "cbc.log"
            cmd = pulp.COIN_CMD(
                path=path, msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=threads,
                logPath=str(log), warmStart=bool(warm_start),
                options=[f"randomSeed {seed + 1}", *(f"{k} {v}" for k, v in params.items())],
            )
            prob.solve(cmd)
            text = log.read_text() if log.exists() else ""
        found = _CBC_BOUND.search(text)
        bound = float(found.group(1)) if found else math.nan
    elif backend == "highs":
        bound = _solve_highs(prob, time_limit_s=time_limit_s, gap_rel=gap_rel, threads=threads,
                             seed=seed, warm=bool(warm_start), params=params, log_path=log_path)
    else:
        if backend not in pulp.listSolvers():
            raise ValueError(f"unknown PuLP solver {backend!r}; valid: cbc, highs, "
                             f"{', '.join(pulp.listSolvers())}")
        kwargs: dict[str, Any] = {"msg": False, "timeLimit": time_limit_s, "gapRel": gap_rel,
                                  "threads": threads, "warmStart": bool(warm_start)}
        if log_path:
            kwargs["logPath"] = log_path
        try:
            cmd = pulp.getSolver(backend, **kwargs, **{k: _typed(v) for k, v in params.items()})
        except TypeError as exc:
            raise ValueError(f"PuLP solver {backend!r}: {exc}") from None
        if not cmd.available():
            raise ValueError(f"PuLP solver {backend!r} is not installed here")
        prob.solve(cmd)
        bound = math.nan  # PuLP does not read a MIP bound back from other solvers

    if prob.status == pulp.LpStatusInfeasible:
        raise ValueError("the model is infeasible (no assignment satisfies every constraint)")
    if prob.sol_status == pulp.LpSolutionOptimal:
        value = pulp.value(prob.objective)
        if not math.isfinite(bound):
            bound = float(value) if value is not None else math.nan
        return OPTIMAL, bound, ""
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        value = pulp.value(prob.objective)
        if value is not None and math.isfinite(bound) and _gap_closed(float(value), bound, gap_rel):
            # stopped by the clock, but the incumbent already meets the proven bound
            return OPTIMAL, bound, ""
        return FEASIBLE, bound, (f"time limit {time_limit_s:g} s (or a solver limit) reached: "
                                 "best incumbent returned")
    return NO_SOLUTION, bound, (f"time limit {time_limit_s:g} s (or a solver limit) reached "
                                "without a solution")


def _solve_highs(prob: Any, *, time_limit_s: float, gap_rel: float, threads: int, seed: int,
                 warm: bool, params: dict[str, str], log_path: str | None) -> float:
    """HiGHS in process; returns the MIP dual bound in the model's sense.

    HiGHS keeps one global thread pool sized by the first solve's ``threads``; a later solve
    asking for another size fails at once (a model error PuLP reads as "no solution"). The pool
    is therefore reset before every solve, so results do not depend on earlier calls.
    """
    import highspy
    import pulp

    _silence_highs_banner()

    class _Highs(pulp.HiGHS):  # type: ignore[misc, name-defined]
        def callSolver(self, lp: Any) -> None:
            model = lp.solverModel
            if log_path:
                model.setOptionValue("output_flag", True)
                model.setOptionValue("log_to_console", False)
                model.setOptionValue("log_file", str(log_path))
            for key, value in params.items():
                if model.setOptionValue(key, _typed(value)) != highspy.HighsStatus.kOk:
                    raise ValueError(f"HiGHS rejected option {key}={value}")
            if warm:  # setInitialValue stored the start in varValue
                cols = [(v.index, float(v.varValue or 0.0)) for v in lp.variables()]
                model.setSolution(len(cols), [c for c, _ in cols], [x for _, x in cols])
            model.run()
            status = model.getModelStatus()
            if status in (highspy.HighsModelStatus.kModelError, highspy.HighsModelStatus.kSolveError,
                          highspy.HighsModelStatus.kLoadError):
                raise RuntimeError(f"HiGHS failed: {model.modelStatusToString(status)}")

        def findSolutionValues(self, lp: Any) -> tuple[int, int]:
            try:
                return super().findSolutionValues(lp)  # type: ignore[no-any-return]
            except KeyError:  # a limit PuLP's table lacks (e.g. a node limit): interrupted
                has = lp.solverModel.getInfo().primal_solution_status == 2
                return ((pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible) if has
                        else (pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound))

    reset_highs_threads()
    cmd = _Highs(msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=threads,
                 random_seed=seed)
    prob.solve(cmd)
    try:
        bound = float(prob.solverModel.getInfo().mip_dual_bound)
        if prob.sense == pulp.LpMaximize:  # PuLP hands HiGHS the negated objective
            bound = -bound
    except AttributeError:  # pragma: no cover - older highspy
        bound = math.nan
    return bound


def reset_highs_threads() -> None:
    """Reset HiGHS's process-wide thread pool (sized by the first solve that used it), so the
    next solve may use any ``threads`` value; cheap, and needed before every HiGHS solve whose
    caller (PuLP, cvxpy) cannot know what ran before."""
    import highspy

    _silence_highs_banner()
    highspy.Highs.resetGlobalScheduler(True)


def _gap_closed(value: float, bound: float, gap_rel: float) -> bool:
    """True when the incumbent is within ``gap_rel`` (relative) of the proven bound."""
    return abs(value - bound) <= max(gap_rel, 1e-9) * max(1.0, abs(value)) + 1e-9


@lru_cache(maxsize=1)
def _silence_highs_banner() -> None:
    """HiGHS writes a copyright banner to the process's stdout when the first ``Highs`` object
    is created, before ``output_flag`` can be set; create that first one with fd 1 muted so
    library code prints nothing."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
