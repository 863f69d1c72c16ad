"""The shared suite every registered solver inherits (in the spirit of PuLP's BaseSolverTest):
one subclass per registered name, generated below, so a new solver is tested by registering it."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from balanceroute.solvers import (
    SOLVERS,
    ClairvoyantInstance,
    Solution,
    TickInstance,
    get_solver,
    solver_names,
)
from balanceroute.solvers.base import modules_available
from balanceroute.solvers.factories import tiny_clairvoyant_instance, tiny_tick_instance


class BaseSolverTest:
    """Properties every solver must have, whatever its backend."""

    solver_name: str = ""

    @pytest.fixture
    def solver(self):
        if not SOLVERS[self.solver_name].is_available():
            pytest.skip(f"{self.solver_name}: backend not installed")
        return get_solver(self.solver_name)

    def instance(self, seed: int):
        rng = np.random.default_rng(seed)
        if SOLVERS[self.solver_name].problem == "tick":
            return tiny_tick_instance(rng)
        return tiny_clairvoyant_instance(rng)

    def test_returns_solution_with_exact_objective(self, solver) -> None:
        inst = self.instance(1)
        sol = solver.solve(inst, time_limit_s=20)
        assert isinstance(sol, Solution)
        assert sol.solver == self.solver_name
        assert sol.status == "optimal"
        assert math.isfinite(sol.objective) and sol.gap == pytest.approx(0.0, abs=1e-9)
        assert sol.wall_s >= 0

    def test_bound_on_the_right_side(self, solver) -> None:
        for seed in range(3):
            sol = solver.solve(self.instance(seed), time_limit_s=20)
            if sol.sense == "max":
                assert sol.bound >= sol.objective - 1e-6
            else:
                assert sol.bound <= sol.objective + 1e-6

    def test_rejects_wrong_instance_type(self, solver) -> None:
        other = (ClairvoyantInstance(num_replicas=1, slots=1, prompt_len=[1], output_len=[1])
                 if solver.problem == "tick" else TickInstance.br0([1], [1], [1]))
        with pytest.raises(ValueError):
            solver.solve(other)

    def test_rejects_bad_arguments(self, solver) -> None:
        inst = self.instance(0)
        with pytest.raises(ValueError, match="time_limit_s"):
            solver.solve(inst, time_limit_s=0)
        with pytest.raises(ValueError, match="gap_rel"):
            solver.solve(inst, gap_rel=-0.1)
        with pytest.raises(ValueError, match="threads"):
            solver.solve(inst, threads=0)

    def test_deterministic(self, solver) -> None:
        inst = self.instance(4)
        a = solver.solve(inst, seed=3)
        b = solver.solve(inst, seed=3)
        assert a.objective == b.objective


for _name in SOLVERS:
    _cls = type(f"Test_{_name.replace('-', '_')}", (BaseSolverTest,), {"solver_name": _name})
    globals()[_cls.__name__] = _cls
del _name, _cls


def test_get_solver_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="valid: .*tick-cpsat"):
        get_solver("gurobi")


def test_is_available_does_not_import(monkeypatch) -> None:
    import sys

    pytest.importorskip("ortools", reason="the solvers extra (OR-Tools) is not installed")
    monkeypatch.delitem(sys.modules, "ortools.sat.python.cp_model", raising=False)
    assert SOLVERS["tick-cpsat"].is_available()
    assert "ortools.sat.python.cp_model" not in sys.modules
    assert not modules_available("no_such_backend_module")


def test_registry_covers_both_problems() -> None:
    assert {"tick-cbc", "tick-highs", "tick-cpsat", "tick-brute"} <= set(solver_names("tick"))
    assert {"clairvoyant-cpsat", "clairvoyant-cbc", "clairvoyant-highs"} <= set(
        solver_names("clairvoyant"))


def test_solution_serialisable_fields() -> None:
    # Loads 3, 1 and one 2-token request: onto the replica at 1 (margin 2) F = 2; onto the
    # envelope replica F = 2 − 2·2 = −2. The optimum's fields survive a JSON round trip.
    sol = get_solver("tick-brute").solve(TickInstance.br0([3, 1], [1, 1], [2]))
    back = json.loads(json.dumps({"objective": sol.objective, "bound": sol.bound,
                                  "replica": sol.replica.tolist()}))
    assert back == {"objective": 2.0, "bound": 2.0, "replica": [1]}


def test_generic_pulp_solver_by_name() -> None:
    pytest.importorskip("pulp", reason="the solvers extra (PuLP) is not installed")
    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6], objective="imbalance")
    assert get_solver("tick-pulp:HiGHS").solve(inst, time_limit_s=30).objective == 3.0
    # PuLP's deprecated bundled-CBC class runs the same CBC through COIN_CMD, without warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert get_solver("tick-pulp:PULP_CBC_CMD").solve(inst, time_limit_s=30).objective == 3.0
    with pytest.raises(ValueError, match="unknown PuLP solver"):
        get_solver("tick-pulp:NOPE")
    import pulp

    missing = [n for n in pulp.listSolvers() if n not in pulp.listSolvers(onlyAvailable=True)]
    if missing:
        with pytest.raises(ValueError, match="not installed"):
            get_solver(f"clairvoyant-pulp:{missing[0]}")


@pytest.mark.parametrize("name", ["tick-cpsat", "tick-highs", "tick-cbc"])
def test_solver_params_and_logs(name: str, tmp_path) -> None:
    if not SOLVERS[name].is_available():
        pytest.skip(f"{name}: backend not installed")
    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6], objective="imbalance")
    param = {"tick-cpsat": ("max_deterministic_time", "5"), "tick-highs": ("mip_rel_gap", "0"),
             "tick-cbc": ("maxNodes", "100000")}[name]
    log = tmp_path / "solve.log"
    sol = get_solver(name).solve(inst, time_limit_s=30, params=dict([param]), log_path=str(log))
    assert sol.objective == 3.0 and log.stat().st_size > 0
    if name != "tick-cbc":  # CBC reads unknown options as no-ops; the in-process ones check
        with pytest.raises(ValueError):
            get_solver(name).solve(inst, time_limit_s=30, params={"no_such_option": "1"})


def test_exported_models_carry_the_objective_constant(tmp_path) -> None:
    # Post-tick imbalance optimum 3 (test_tick_known): the exported MPS / LP, read back by
    # HiGHS, and the CP-SAT model, re-solved, must give 3 — the −ΣL constant included.
    pytest.importorskip("highspy", reason="HiGHS (highspy) is not installed")
    pytest.importorskip("ortools", reason="OR-Tools is not installed")
    import highspy
    from ortools.sat.python import cp_model

    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6], objective="imbalance")
    f_inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6])  # max F* = 6
    get_solver("tick-highs").solve(inst, time_limit_s=30, export=str(tmp_path / "m"))
    get_solver("tick-cbc").solve(f_inst, time_limit_s=30, export=str(tmp_path / "f"))
    for path, value in (("m.mps", 3.0), ("m.lp", 3.0), ("f.mps", 6.0), ("f.lp", 6.0)):
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.readModel(str(tmp_path / path))
        h.run()
        assert h.getInfo().objective_function_value == pytest.approx(value), path
    get_solver("tick-cpsat").solve(inst, time_limit_s=30, export=str(tmp_path / "c"))
    model = cp_model.CpModel()
    model.proto.parse_text_format((tmp_path / "c.cpsat.pb.txt").read_text())
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(model) == cp_model.OPTIMAL
    assert solver.objective_value == pytest.approx(3.0)


@pytest.mark.parametrize("backend", ["SCIP_PY", "GLPK_CMD", "GUROBI", "CPLEX_PY"])
def test_other_pulp_solvers_agree_with_brute_force(backend: str) -> None:
    pulp = pytest.importorskip("pulp", reason="the solvers extra (PuLP) is not installed")
    if backend not in pulp.listSolvers(onlyAvailable=True):
        pytest.skip(f"{backend} is not installed here")
    rng = np.random.default_rng(31)
    for objective in ("f_score", "imbalance"):
        for _ in range(5):
            inst = tiny_tick_instance(rng, objective=objective)
            ref = get_solver("tick-brute").solve(inst).objective
            sol = get_solver(f"tick-pulp:{backend}").solve(inst, time_limit_s=30)
            assert sol.status == "optimal" and sol.objective == pytest.approx(ref, abs=1e-6)
    clair = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 2])
    assert get_solver(f"clairvoyant-pulp:{backend}").solve(clair, time_limit_s=30).objective == 8.0
