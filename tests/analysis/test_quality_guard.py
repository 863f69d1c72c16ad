"""The guard's experiment: its cells, one run, and the per-group verdicts on known rows."""

import pytest

from balanceroute.analysis.quality_guard import declare_guard, guard_lines, run_guard_cell


def test_cells_name_the_guarded_rows_and_their_setting():
    cells = declare_guard(draws="training", max_draws=2, first_draw=1, settings=("default",),
                          only=("shape-mixed:8", "mooncake-conv:16"))
    assert {(c.workload, c.replicas) for c in cells} == {("shape-mixed", 8), ("mooncake-conv", 16)}
    assert sorted({c.seed for c in cells}) == [101, 102]
    assert sorted({c.policy for c in cells}) == ["br0", "brh-oracle", "brh-oracle-guard",
                                                 "brh-survival", "brh-survival-guard"]
    guarded = [c for c in cells if c.policy.endswith("-guard")]
    assert all(c.option("guard") == "default" for c in guarded)
    assert all(c.option("thin") == 0.9 for c in cells if c.workload == "mooncake-conv")
    with pytest.raises(ValueError, match="unknown"):
        declare_guard(settings=("nope",))


def test_a_guarded_cell_reports_what_the_guard_did():
    cell = next(c for c in declare_guard(draws="training", max_draws=1, only=("shape-summarize:16",))
                if c.policy == "brh-oracle-guard")
    row = run_guard_cell(cell)[0]
    assert row["mean_imbalance"] > 0 and 0.0 <= row["lookahead_share"] <= 1.0
    assert row["incumbent"] in (0, 1) and row["locked"] in (True, False)


def _rows(ratio_oracle: float, ratio_guard: float) -> list[dict]:
    rows = []
    for seed, wiggle in ((1000, 0.99), (1001, 1.01), (1002, 1.0)):
        for policy, imb in (("br0", 100.0), ("brh-oracle", 100.0 * ratio_oracle * wiggle),
                            ("brh-survival", 100.0), ("brh-oracle-guard", 100.0 * ratio_guard),
                            ("brh-survival-guard", 100.0)):
            rows.append({"workload": "w", "replicas": 8, "seed": seed, "policy": policy,
                         "mean_imbalance": imb, "lookahead_share": 0.1,
                         "guard": "default" if policy.endswith("-guard") else ""})
    return rows


def test_guard_lines_judge_each_row_against_br0():
    text = "\n".join(guard_lines(_rows(1.10, 1.0)))
    assert "- oracle: holds in 0, undecided in 0, breaks in 1 of 1" in text
    assert "- oracle-guard: holds in 1, undecided in 0, breaks in 0 of 1" in text
    assert "- survival-guard: holds in 1" in text
    # a guarded row 5 % above br0 on every draw breaks
    assert "- oracle-guard: holds in 0, undecided in 0, breaks in 1 of 1" in "\n".join(
        guard_lines(_rows(1.10, 1.05)))
