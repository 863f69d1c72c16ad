"""Instance validation and JSON round trips."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.solvers import ClairvoyantInstance, TickInstance, load_instance, save_instance
from balanceroute.solvers.bridge import simulate_schedule
from balanceroute.solvers.clairvoyant_eval import fine_loads
from balanceroute.solvers.factories import tiny_clairvoyant_instance, tiny_tick_instance


def test_tick_roundtrip(tmp_path, rng) -> None:
    inst = tiny_tick_instance(rng)
    path = tmp_path / "t.json"
    save_instance(inst, path)
    back = load_instance(path)
    assert isinstance(back, TickInstance)
    assert np.array_equal(back.proj_loads, inst.proj_loads)
    assert np.array_equal(back.prompt_len, inst.prompt_len)
    assert back.beta == inst.beta and back.objective == inst.objective


def test_clairvoyant_roundtrip(tmp_path, rng) -> None:
    inst = tiny_clairvoyant_instance(rng)
    path = tmp_path / "c.json"
    save_instance(inst, path)
    back = load_instance(path)
    assert isinstance(back, ClairvoyantInstance)
    assert np.array_equal(back.release, inst.release) and back.slots == inst.slots


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"free_slots": [1, 1, 1]}, "free_slots has shape"),
        ({"prompt_len": [0, 3]}, "prompt_len must be >= 1"),
        ({"prompt_len": [1.5, 3]}, "integers"),
        ({"count": 5}, "count=5 is infeasible"),
        ({"d": [0.0]}, "discounts"),
        ({"objective": "makespan"}, "objective="),
    ],
)
def test_tick_validation(kwargs, match) -> None:
    base = {"proj_loads": [[3.0], [1.0]], "free_slots": [1, 1], "prompt_len": [2, 3]}
    with pytest.raises(ValueError, match=match):
        TickInstance(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"output_len": [1]}, "output_len has shape"),
        ({"release": [-1, 0]}, "release must be >= 0"),
        ({"horizon": 2}, "cannot finish within horizon"),
        ({"horizon": 4, "slots": 1, "num_replicas": 1}, "infeasible"),
        ({"step": 0}, "step="),
    ],
)
def test_clairvoyant_validation(kwargs, match) -> None:
    base = {"num_replicas": 2, "slots": 1, "prompt_len": [2, 3], "output_len": [3, 3]}
    with pytest.raises(ValueError, match=match):
        ClairvoyantInstance(**{**base, **kwargs})


def test_load_rejects_unknown_fields(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"kind": "tick", "proj_loads": [[1]], "free_slots": [1], "prompt_len": [1], "x": 1}')
    with pytest.raises(ValueError, match="unknown tick instance field"):
        load_instance(path)
    path.write_text('{"kind": "nope"}')
    with pytest.raises(ValueError, match="'kind'"):
        load_instance(path)


def test_shipped_benchmarks_hold_their_proven_optima() -> None:
    pytest.importorskip("ortools", reason="the solvers extra (OR-Tools) is not installed")
    from balanceroute.solvers import get_solver
    from balanceroute.solvers.benchmarks import load_benchmarks
    from balanceroute.solvers.clairvoyant_eval import evaluate_schedule
    from balanceroute.solvers.migration import migration_bound_dp

    records = load_benchmarks()
    assert len(records) >= 30
    checked = 0
    for inst, rec in records:
        assert rec["bound"] <= rec["incumbent"]
        assert rec["optimum"] is None or rec["bound"] == rec["incumbent"] == rec["optimum"]
        assert rec.get("migration_bound", 0.0) <= rec["incumbent"]
        if inst.num_requests <= 5:  # tiny: re-prove the optimum
            sol = get_solver("clairvoyant-cpsat").solve(inst, time_limit_s=60)
            assert sol.status == "optimal" and sol.objective == rec["optimum"]
            assert evaluate_schedule(inst, sol.replica, sol.start)["objective"] == rec["optimum"]
        elif inst.num_requests == 8 and checked < 2:  # two of the migration bounds, re-derived
            assert migration_bound_dp(inst) == rec["migration_bound"]
            checked += 1


def test_life_loads_worked_example_and_every_schedule(rng) -> None:
    # s = (5, 1), o = (2, 3): C = (5 + 6, 1 + 2 + 3) = (11, 6), C = 17.
    inst = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 3])
    assert inst.life_loads.tolist() == [11, 6] and inst.total_load == 17
    # Any schedule's loads summed over replicas and steps are the total load.
    for _ in range(5):
        inst = tiny_clairvoyant_instance(rng)
        run = simulate_schedule(inst, "round_robin")
        assert int(fine_loads(inst, run.replica, run.start)[0].sum()) == inst.total_load
