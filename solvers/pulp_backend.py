"""Running a PuLP model on CBC or HiGHS with a time limit, and reading back status and bound.

Shared by the per-tick and clairvoyant MILPs; the models themselves live in their own modules.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from .base import FEASIBLE, NO_SOLUTION, OPTIMAL

__all__ = ["PULP_BACKENDS", "solve_pulp"]

Backend = Literal["cbc", "highs"]

#: Python modules each PuLP backend needs (``highspy`` for PuLP's in-process ``HiGHS``).
PULP_BACKENDS: dict[str, tuple[str, ...]] = {"cbc": ("pulp",), "highs": ("pulp", "highspy")}

_CBC_BOUND = re.compile(r"^(?:Lower|Upper) bound:\s+(\S+)", re.MULTILINE)


def solve_pulp(
    prob: Any, backend: Backend, *, time_limit_s: float, gap_rel: float, threads: int, seed: int,
) -> tuple[str, float, str]:
    """Solve ``prob`` in place; return ``(status, best_bound, message)``.

    The objective must have no constant term (HiGHS is not given it): callers add constants
    themselves. ``status`` is ``optimal`` (proven within ``gap_rel``), ``feasible`` (time limit with an
    incumbent) or ``no_solution``; ``best_bound`` is in the model's own sense (``nan`` if the
    backend did not report one). Raises ``ValueError`` if the model is proven infeasible.
    """
    import pulp

    if backend == "cbc":
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "cbc.log"
            with warnings.catch_warnings():  # PuLP 3.x flags the bundled CBC for PuLP 4.0
                warnings.simplefilter("ignore", DeprecationWarning)
                cmd = pulp.PULP_CBC_CMD(
                    msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=threads,
                    logPath=str(log), options=[f"randomSeed {seed + 1}"],
                )
            prob.solve(cmd)
            text = log.read_text() if log.exists() else ""
        found = _CBC_BOUND.search(text)
        bound = float(found.group(1)) if found else math.nan
    elif backend == "highs":
        _silence_highs_banner()
        cmd = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=threads,
                         random_seed=seed)
        prob.solve(cmd)
        try:
            bound = float(prob.solverModel.getInfo().mip_dual_bound)
            if prob.sense == pulp.LpMaximize:  # PuLP hands HiGHS the negated objective
                bound = -bound
        except AttributeError:  # pragma: no cover - older highspy
            bound = math.nan
    else:
        raise ValueError(f"backend={backend!r} must be 'cbc' or 'highs'")

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
        return FEASIBLE, bound, f"time limit {time_limit_s:g} s reached: best incumbent returned"
    return NO_SOLUTION, bound, f"time limit {time_limit_s:g} s reached without a solution"


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
