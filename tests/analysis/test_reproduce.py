"""`reproduce` on a tiny grid: CSVs, figures and a report that keeps the hand-written part."""

from __future__ import annotations

from pathlib import Path

import pytest

from balanceroute.analysis import experiments
from balanceroute.analysis.reproduce import reproduce
from balanceroute.analysis.sweep import read_csv

pytest.importorskip("matplotlib", reason="the `plot` extra (matplotlib) is not installed")

TINY = experiments.Profile(
    name="test", slots=8, policies=("random", "jsq", "br0"), table1_workloads=("servegen-r1",),
    calibrated_workloads=("servegen-r1",),
    table1_requests=400, table1_replay_requests=400, seeds=(0,),
    scaling_workloads=("azure-conv-2023",), scaling_replicas=(2, 4), scaling_base=300,
    scaling_per_slot=4, scaling_cap=600, step_workload="azure-conv-2023", step_requests=300,
    step_ratios=(0.0, 1.0), slot_values=(4, 8), tick_workload="azure-conv-2023", tick_replicas=(4,),
    tick_pool_factors=(2,), tick_states=5, tick_repeats=1, tick_per_slot=2, tick_min_requests=300,
    gap_replicas=(2,), gap_workloads=("azure-conv-2023", ""), gap_instances=2, gap_time_limit_s=5.0, clairvoyant_instances=1,
    clairvoyant_requests=5, clairvoyant_time_limit_s=5.0, ratio_replicas=(2,), ratio_instances=2,
    balls_bins=(4, 8), balls_reps=2,
)

SCHEMA = {
    "table1": {"experiment", "workload", "policy", "replicas", "slots", "seed", "mean_imbalance",
               "tpot_ms_p95", "throughput_loaded_tok_s", "throughput_tok_s", "test_requests"},
    "scaling": {"replicas", "policy", "mean_imbalance", "load_std_mean", "envelope_mean"},
    "step_model": {"step_a", "step_b", "a_over_b_rel", "envelope_mean", "active_mean"},
    "tick_timing": {"replicas", "pool_size", "measure", "regime", "p50_us", "p99_us", "ticks"},
    "balls_into_bins": {"bins", "choices", "rep", "max_load"},
}


def test_reproduce_tiny_grid(tmp_path):
    (tmp_path / "DISCUSSION.md").write_text("Hand-written: keep me.")
    result = reproduce(tmp_path, profile=TINY, jobs=1, command="balanceroute reproduce --test")
    assert not result.errors, result.errors
    assert result.grid is not None and result.grid.executed > 0

    for name, columns in SCHEMA.items():
        rows = read_csv(tmp_path / "data" / f"{name}.csv")
        assert rows, name
        assert columns <= set(rows[0]), (name, columns - set(rows[0]))
    table1 = read_csv(tmp_path / "data" / "table1.csv")
    assert {r["policy"] for r in table1} == {"random", "jsq", "br0"}

    for name in ("table1_imbalance", "table1_gain", "scaling_imbalance", "theory_extreme_value",
                 "theory_balls_into_bins", "tick_latency", "step_model"):
        png = tmp_path / "figures" / f"{name}.png"
        assert png.exists() and png.read_bytes()[:4] == b"\x89PNG", name

    report = (tmp_path / "REPORT.md").read_text()
    assert "Hand-written: keep me." in report
    assert "## Table 1" in report and "## Table 2" in report
    assert "438,225" in report  # the paper's Random row next to servegen-r1
    assert "not available" in report  # the brh-* rows this profile leaves out
    assert "](figures/table1_imbalance.png)" in report
    machine_root = str(Path(__file__).resolve().parents[3])  # the folder the checkout sits in
    assert str(tmp_path) not in report and machine_root not in report

    before = (tmp_path / "data" / "table1.csv").read_text()
    again = reproduce(tmp_path, profile=TINY, jobs=1)
    assert again.grid is not None and again.grid.executed == 0 and again.grid.cached > 0
    assert (tmp_path / "data" / "table1.csv").read_text() == before


def test_report_only_reads_the_csvs(tmp_path):
    reproduce(tmp_path, profile=TINY, jobs=1, only=["balls_into_bins"])
    result = reproduce(tmp_path, profile=TINY, report_only=True)
    assert result.grid is None
    report = (tmp_path / "REPORT.md").read_text()
    assert "Balls into bins" in report and "No `table1` data." in report
    with pytest.raises(ValueError, match="unknown experiment"):
        reproduce(tmp_path, profile=TINY, only=["nope"])


def test_report_names_csvs_kept_from_older_code(tmp_path):
    from balanceroute.analysis.report import current_code, provenance
    from balanceroute.analysis.sweep import write_csv

    reproduce(tmp_path, profile=TINY, jobs=1, only=["table1", "balls_into_bins"])
    today = read_csv(tmp_path / "data" / "table1.csv")
    assert {r["code"] for r in today} <= current_code()
    old = [{**r, "code": "0123456789ab"} for r in today]
    lines, stale = provenance({"table1": today, "scaling": old}, current_code())
    assert stale == ["scaling"]
    assert lines[2].endswith("| yes |") and lines[3].endswith("| no: older code |")

    write_csv(old[:1] + today[1:], tmp_path / "data" / "table1.csv")  # one row kept from older code
    reproduce(tmp_path, profile=TINY, report_only=True)
    report = (tmp_path / "REPORT.md").read_text()
    assert "**Some sections come from older code** (`table1`)" in report
    assert "`balanceroute reproduce --only table1`" in report
    assert "| table1 |" in report and "| partly: some rows from older code |" in report
    assert "| balls_into_bins |" in report and "| no code dependency |" in report


def test_clairvoyant_section_states_where_a_bound_is_proven():
    """Two episodes, one with a proven lower bound of 100: BR-0's Σ I(k) of 300 there is 3×
    it, and the other episode (bound 0, nothing proven) is counted but not averaged."""
    from balanceroute.analysis.report import ReportContext, _section_optimality

    def row(instance: str, policy: str, heuristic: float, bound: float) -> dict:
        return {"instance": instance, "policy": policy, "heuristic": heuristic, "bound": bound,
                "rel_gap": heuristic / 200 - 1, "reference": "best schedule found", "step": 8,
                "requests": 16, "replicas": 4, "slots": 3}

    rows = [row("a", "br0", 300.0, 100.0), row("a", "jsq", 500.0, 100.0),
            row("b", "br0", 400.0, 0.0), row("b", "jsq", 450.0, 0.0)]
    ctx = ReportContext(mode="full", command="balanceroute reproduce", profile=experiments.FULL,
                        requested_policies=[], available_policies=[], solver_message="",
                        solvers_available=True)
    text, summary = _section_optimality({"clairvoyant_gap": rows}, ctx, {})
    assert "exists for 1 of 2 episodes, where BR-0's Σ I(k) is on average 3.00× it." in text
    assert "then improved by local search" in text
    assert summary == ["Clairvoyant multi-step gap (Σ_k I(k), 2 small episodes): BR-0 mean 75.0%, "
                       "worst 100.0% above the best clairvoyant schedule found."]


def test_best_baseline_tie_goes_to_the_lowest_seed():
    """Two seeds, each with its own best baseline: the summary names the first seed's, in either
    order of the names (a set's order would give one answer for both)."""
    from balanceroute.analysis.tables import policy_summary

    def rows(first: str, second: str) -> list[dict]:
        out = []
        for seed, best in ((0, first), (1, second)):
            for policy in ("jsq", "least_load", "round_robin", "br0"):
                tput = 110.0 if policy == best else 120.0 if policy == "br0" else 100.0
                out.append({"workload": "w", "policy": policy, "seed": seed,
                            "throughput_loaded_tok_s": tput, "mean_imbalance": 10.0})
        return out

    for first, second in (("least_load", "round_robin"), ("round_robin", "least_load")):
        summary = policy_summary(rows(first, second), by=("workload",))
        assert {r["best_baseline"] for r in summary} == {first}


def test_the_report_reads_every_experiment_reproduce_writes():
    """A grid whose CSV the report does not read is computed and then silently left out of
    REPORT.md and its provenance table (the replicas experiments once were)."""
    from balanceroute.analysis.report import EXPERIMENTS

    for profile in (experiments.FULL, experiments.QUICK):
        declared = set(experiments.declare(profile, ["jsq", "br0", "brh-survival"], solvers=None))
        assert declared <= set(EXPERIMENTS), sorted(declared - set(EXPERIMENTS))
