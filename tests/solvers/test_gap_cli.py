"""``balanceroute gap`` end to end on small inputs, and the gap helpers."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest

from balanceroute.cli import main
from balanceroute.solvers.factories import random_tick_instance
from balanceroute.solvers.gap import heuristic_gap, summarize, tick_gap_rows
from tests.solvers.extras import needs

pytestmark = needs("ortools", "pulp", "highspy", "cvxpy")



def test_heuristic_gap_signs() -> None:
    assert heuristic_gap(8.0, 10.0, "max") == pytest.approx(0.2)
    assert heuristic_gap(12.0, 10.0, "min") == pytest.approx(0.2)
    assert heuristic_gap(0.5, 0.0, "min") == pytest.approx(0.5)  # normalised by max(|r|, 1)


def test_tick_rows_never_beat_optimum() -> None:
    rng = np.random.default_rng(0)
    insts = [random_tick_instance(rng, num_replicas=3, pool_size=8) for _ in range(6)]
    rows = tick_gap_rows(insts, policies=["br0", "least_load"], lp_bound=True)
    assert all(not r["beats_optimum"] and r["rel_gap"] >= -1e-12 for r in rows)
    assert all(r["lp_bound"] >= r["optimum"] - 1e-6 for r in rows)
    summary = {s["policy"]: s for s in summarize(rows)}
    assert summary["br0"]["instances"] == 6 and summary["br0"]["violations"] == 0


def test_cli_tick_random_with_csv_and_roundtrip(tmp_path, capsys) -> None:
    out = tmp_path / "gaps.csv"
    saved = tmp_path / "inst"
    assert main(["gap", "--instances", "3", "--replicas", "3", "--pool", "6", "--csv", str(out),
                 "--save", str(saved), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "summary (tick" in text and "br0" in text
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 3 * 6  # br0 + five baselines
    files = sorted(saved.glob("*.json"))
    assert len(files) == 3
    assert main(["gap", "--load", *map(str, files), "--policies", "br0", "--quiet",
                 "--summary-only"]) == 0
    assert "summary (tick" in capsys.readouterr().out


def test_cli_clairvoyant_random(capsys) -> None:
    assert main(["gap", "--mode", "clairvoyant", "--instances", "1", "--requests", "5",
                 "--replicas", "2", "--slots", "2", "--policies", "br0,least_load",
                 "--time-limit", "20", "--quiet", "--lp-bound"]) == 0
    assert "summary (clairvoyant" in capsys.readouterr().out


def test_cli_user_errors(capsys) -> None:
    assert main(["gap", "--policies", "nope", "--quiet"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert main(["gap", "--solver", "clairvoyant-cpsat", "--quiet"]) == 2
    assert "does not solve tick" in capsys.readouterr().err


def test_cli_clairvoyant_toolkit(tmp_path, capsys) -> None:
    logs, models = tmp_path / "logs", tmp_path / "models"
    assert main(["gap", "--mode", "clairvoyant", "--instances", "1", "--requests", "4",
                 "--replicas", "2", "--slots", "1", "--policies", "br0,jsq", "--step", "1",
                 "--time-limit", "30", "--solver-param", "max_deterministic_time=20",
                 "--solver-log", str(logs), "--export", str(models)]) == 0
    captured = capsys.readouterr()
    assert "proven lower bounds" in captured.out and "sum_rel_gap" in captured.out
    assert "\r" not in captured.err  # no progress-bar frames when stderr is not a terminal
    assert "gap clairvoyant: 1/1 instances" in captured.err
    assert list(logs.glob("*.log")) and list(models.glob("*.cpsat.pb.txt"))


def test_cli_solver_param_errors(capsys) -> None:
    assert main(["gap", "--instances", "1", "--pool", "3", "--solver-param", "oops",
                 "--quiet"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["gap", "--instances", "1", "--pool", "3", "--solver-param", "nope=1",
                 "--quiet"]) == 2
    assert "no parameter 'nope'" in capsys.readouterr().err


def test_cli_tick_export_with_highs(tmp_path) -> None:
    pytest.importorskip("highspy", reason="HiGHS (highspy) is not installed")
    assert main(["gap", "--instances", "2", "--pool", "4", "--solver", "tick-highs",
                 "--export", str(tmp_path), "--quiet", "--summary-only"]) == 0
    assert len(list(tmp_path.glob("*.mps"))) == 2 and len(list(tmp_path.glob("*.lp"))) == 2


def test_cli_loads_the_benchmark_library(tmp_path, capsys) -> None:
    import json

    from balanceroute.solvers.benchmarks import load_benchmarks

    inst, rec = load_benchmarks()[0]
    lib = tmp_path / "lib.json"
    lib.write_text(json.dumps({"records": [rec]}))
    out = tmp_path / "rows.csv"
    assert main(["gap", "--load", str(lib), "--policies", "br0", "--time-limit", "30",
                 "--quiet", "--summary-only", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert float(rows[0]["optimum"]) == rec["optimum"] and rows[0]["reference"] == "optimum"


def test_cli_clairvoyant_pigeonhole_bound_is_printed_with_its_method(tmp_path, capsys) -> None:
    # Coarsened (q = 2), so the model proves nothing and the bound comes from a relaxation:
    # loads 50, 10, 10, 10 then 51, 11, 11, 11 on G = 2, B = 2 give I ≥ 40 per step (the
    # replica of the largest holds one more request), 80 in all = the best schedule; the
    # aggregated relaxation alone proves only 38 (the closed form).
    from balanceroute.solvers import ClairvoyantInstance
    from balanceroute.solvers.instances import save_instance

    path = tmp_path / "ep.json"
    save_instance(ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[50, 10, 10, 10],
                                      output_len=[2, 2, 2, 2], step=2), path)
    assert main(["gap", "--load", str(path), "--policies", "br0", "--time-limit", "10",
                 "--relaxation", "partition", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("best 80, lower bound 80 (100.0 % of best; aggregated relaxation with pigeonhole "
            "cuts (CP-SAT))") in out
    # Each relaxation's value at the best schedule (all start at 0): 20 + 18, then 40 + 40;
    # the partial binding with every request bound (K = 8 ≥ n) is the schedule's own value.
    assert ("the most each relaxation could prove (its value at the best schedule): aggregated "
            "38, pigeonhole cuts 80, migration 80, partial binding (exact) 80") in out
    assert main(["gap", "--load", str(path), "--policies", "br0", "--time-limit", "10",
                 "--relaxation", "aggregate", "--quiet"]) == 0
    assert "lower bound 38 (47.5 % of best; closed form)" in capsys.readouterr().out


def test_cli_partial_binding_bound_closes_the_gap_migration_leaves(tmp_path, capsys) -> None:
    # G = 2, B = 2, five requests, coarsened (q = 2) so the model proves nothing. Letting the
    # requests migrate proves only 6; binding all five for life (the partial-binding DP with
    # K = n) is the clairvoyant problem itself: 22, the best schedule (checked by brute force).
    from balanceroute.solvers import ClairvoyantInstance
    from balanceroute.solvers.instances import save_instance
    from tests.solvers.brute import enumerate_clairvoyant

    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[9, 24, 20, 1, 12],
                               output_len=[2, 2, 1, 2, 2], step=2)
    assert enumerate_clairvoyant(dataclasses.replace(inst, step=1)) == 22.0
    path = tmp_path / "ep.json"
    save_instance(inst, path)
    args = ["gap", "--load", str(path), "--policies", "br0", "--time-limit", "2", "--quiet"]
    assert main([*args, "--relaxation", "migration"]) == 0
    assert "lower bound 6 (27.3 % of best; migration relaxation (exact DP))" in \
        capsys.readouterr().out
    assert main(args) == 0  # auto: the partial-binding DP, default K = 8 ≥ n
    out = capsys.readouterr().out
    assert ("best 22, lower bound 22 (100.0 % of best; partial binding, 5 largest bound for "
            "life (exact DP))") in out
    assert main([*args, "--relaxation", "binding", "--bound-requests", "2"]) == 0
    assert "partial binding, 2 largest bound for life (exact DP)" in capsys.readouterr().out
    assert main([*args, "--bound-requests", "-1"]) == 2
