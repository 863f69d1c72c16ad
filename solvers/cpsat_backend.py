"""Running a CP-SAT model: limits, seed, user parameters, a log file, and writing the model out;
and the activity / load recurrence of the start-indexed relaxations.

Shared by every CP-SAT model (``tick_cpsat``, ``clairvoyant_cpsat``, ``aggregate_bound``,
``binding_bound``), as ``pulp_backend`` is for the PuLP models.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["export_cpsat", "life_recurrence", "run_cpsat"]


def _set_param(parameters: Any, key: str, value: str) -> None:
    """Set one ``SatParameters`` field from its text, typed like the field's current value."""
    if key.startswith("_") or not hasattr(parameters, key):
        raise ValueError(f"CP-SAT has no parameter {key!r} (see sat_parameters.proto)")
    current = getattr(parameters, key)
    text = value.strip()
    try:
        if isinstance(current, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            typed: Any = text.lower() in ("true", "1")
        elif isinstance(current, int) and not isinstance(current, bool) and type(current) is int:
            typed = int(text)
        elif isinstance(current, float):
            typed = float(text)
        elif isinstance(current, str):
            typed = text
        else:  # an enum: by name or number
            enum = type(current)
            typed = enum(int(text)) if text.lstrip("-").isdigit() else getattr(enum, text)
        setattr(parameters, key, typed)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"CP-SAT parameter {key}={value!r} has the wrong type") from None


def life_recurrence(model: Any, starts: Mapping[int, Any], steps: Iterable[int], prompt: int,
                    output: int, tag: str) -> Iterator[tuple[int, Any, Any, Any]]:
    """One request's activity a(k) ∈ {0, 1} and load ℓ(k) over ``steps`` (consecutive, from
    its first possible start), given its start indicators ``starts`` {t: x_t}: yields
    ``(k, a(k), ℓ(k), x_k)`` (x_k = 0 where it cannot start), adding

        a(k) = a(k−1) + x_k − x_{k−o},   ℓ(k) = ℓ(k−1) + a(k−1) − x_{k−o} + s·x_k − (s+o−1)·x_{k−o}

    (a start adds s, each running step adds 1, the end removes the last load s + o − 1), with
    a, ℓ = 0 before the first step; variables are named ``a_{tag}_{k}`` and ``l_{tag}_{k}``.
    Lazy: what the caller adds between two steps stays in the model in that order."""
    a_prev: Any = 0
    l_prev: Any = 0
    for k in steps:
        begin = starts.get(k, 0)
        end = starts.get(k - output, 0)
        a_k = model.new_bool_var(f"a_{tag}_{k}")
        l_k = model.new_int_var(0, prompt + output - 1, f"l_{tag}_{k}")
        model.add(a_k == a_prev + begin - end)
        model.add(l_k == l_prev + a_prev - end + prompt * begin - (prompt + output - 1) * end)
        yield k, a_k, l_k, begin
        a_prev, l_prev = a_k, l_k


def export_cpsat(model: Any, stem: str, *, scale: float = 1.0, constant: float = 0.0) -> str:
    """Write ``model`` as ``<stem>.cpsat.pb.txt`` (CP-SAT's text format) with the objective's
    scaling factor and offset set so its objective value is the instance's own (scale × the
    model's value + constant); the model being solved is not changed. Returns the path."""
    copy = model.clone()
    if copy.proto.has_objective():
        obj = copy.proto.objective
        factor = (obj.scaling_factor or 1.0) * float(scale)
        obj.offset = obj.offset + float(constant) / factor
        obj.scaling_factor = factor
    path = f"{stem}.cpsat.pb.txt"
    if not copy.export_to_file(path):
        raise ValueError(f"could not write {path}")
    return path


def stop_message(solver: Any, time_limit_s: float, *, found: bool) -> str:
    """Why a CP-SAT solve ended without a proof: its deterministic budget
    (``max_deterministic_time``, when one was set and spent) or the wall-clock limit."""
    budget = solver.parameters.max_deterministic_time
    spent = solver.response_proto.deterministic_time
    if math.isfinite(budget) and spent >= 0.99 * budget:
        why = f"deterministic budget {budget:g} s reached (wall-clock cap {time_limit_s:g} s)"
    else:
        why = f"time limit {time_limit_s:g} s reached"
    return why + ("" if found else " without a solution")


def run_cpsat(
    model: Any, *, time_limit_s: float, gap_rel: float, threads: int, seed: int,
    params: Mapping[str, str] | None = None, log_path: str | None = None,
) -> tuple[Any, int]:
    """Solve ``model``; return ``(solver, status code)``. ``params`` (``KEY=VALUE`` texts, e.g.
    ``max_deterministic_time=5``) override the defaults; ``log_path`` receives CP-SAT's search
    log (nothing is printed)."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.relative_gap_limit = gap_rel
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = seed
    for key, value in (params or {}).items():
        _set_param(solver.parameters, key, str(value))
    if log_path is None:
        return solver, solver.solve(model)
    solver.parameters.log_search_progress = True
    solver.parameters.log_to_stdout = False
    with open(log_path, "w") as log:
        solver.log_callback = lambda line: log.write(line + "\n")
        code = solver.solve(model)
    return solver, code
