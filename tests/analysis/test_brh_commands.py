"""The logic of ``balanceroute predictors`` and ``balanceroute tune`` on tiny traces."""

import argparse
import json
import re

import pytest

from balanceroute.analysis.predictors import (
    add_predictors_args,
    calibration_records,
    format_calibration,
    run_predictors,
)
from balanceroute.analysis.tune import TuneGrid, add_tune_args, format_tune, run_tune, tune_brh
from balanceroute.core.predictors import split_workload
from tests.factories import lognormal_workload


def test_calibration_records_and_table():
    train, test = split_workload(lognormal_workload(600, seed=1, output_mu=4.0), 0.5)
    records = calibration_records(train, test, ["oracle", "survival"], horizon=20, simulate_on=(2, 4))
    assert [r["predictor"] for r in records] == ["(br0, no predictor)", "oracle", "survival"]
    assert records[1]["auc"] == 1.0 and records[1]["brier"] == 0.0
    assert 0.5 < records[2]["auc"] < 1.0 and "mean_imbalance" in records[2]
    table = format_calibration(records + [{"predictor": "learned", "skipped": "no torch"}])
    assert "AUC" in table and "ECE" in table and "learned  skipped: no torch" in table
    with pytest.raises(ValueError, match="valid: oracle"):
        calibration_records(train, test, ["tea_leaves"], horizon=20)


def test_tune_is_seeded_and_reports_the_default_and_br0():
    train = lognormal_workload(400, seed=2, output_mu=4.0)
    grid = TuneGrid(horizon=(10, 20), gamma=(1.0,), beta_per_replica=(1.0, 16.0), s_greedy=(0, 8))
    calls = []
    a = tune_brh(train, num_replicas=2, slots=4, trials=3, seed=5, grid=grid,
                 progress=lambda done, total, rec: calls.append((done, total)))
    b = tune_brh(train, num_replicas=2, slots=4, trials=3, seed=5, grid=grid)
    assert a == b
    assert calls[-1] == (4, 4)  # br0 + 3 candidates
    assert sum(r["policy"] == "br0" for r in a) == 1
    assert sum(bool(r.get("default")) for r in a) == 1
    assert [r["mean_imbalance"] for r in a] == sorted(r["mean_imbalance"] for r in a)
    assert "br0" in format_tune(a)
    with pytest.raises(ValueError, match="trials"):
        tune_brh(train, num_replicas=2, trials=0)


def _parse(add, argv):
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def test_commands_run_end_to_end(capsys):
    common = ["--workload", "azure-2024-long", "--requests", "400", "--horizon", "40"]
    args = _parse(add_predictors_args, [*common, "--predictors", "oracle,survival,noise", "--json"])
    assert run_predictors(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["predictor"] for r in out] == ["oracle", "survival", "noise"]
    args = _parse(add_tune_args, [*common, "--replicas", "2", "--slots", "8", "--trials", "2", "-q"])
    assert run_tune(args) == 0
    # the candidates are H = 40 and the shipped default (H = 80): either may win
    assert re.search(r"chosen: horizon=(40|80) ", capsys.readouterr().out)
