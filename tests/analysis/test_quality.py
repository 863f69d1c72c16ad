"""The quality matrix: the rules on hand-made rows, the declared grids, and one real cell each way."""

import math

import numpy as np
import pytest

from balanceroute.analysis.quality import (
    GENERATED,
    HELD_OUT_SEEDS,
    QUALITY_POLICIES,
    REPLAY_THIN,
    SHAPE_GROUPS,
    TRAINING_SEEDS,
    context_lines,
    declare_quality,
    floor_lines,
    lookahead_lines,
    matrix_lines,
    noise_floors,
    paired_interval,
    paper_lines,
    powered_lines,
    rule_violations,
    run_quality_cell,
    saturated_capacity,
    t_quantile,
    ttft_lines,
    verdict,
)
from balanceroute.analysis.sweep import Cell


def _rows(cell: dict, **imbalance: float) -> list[dict]:
    # throughput in the reverse order of imbalance unless the caller breaks it
    return [{**cell, "policy": p, "mean_imbalance": v, "throughput_loaded_tok_s": 1e6 / v,
             "tpot_ms_p95": 50.0} for p, v in imbalance.items()]


def test_rules_count_the_cells_that_break_them():
    a = dict(workload="w", replicas=8, requests=3000, seed=0, load="saturated")
    b = {**a, "load": 0.5}
    rows = _rows(a, jsq=100.0, least_load=90.0, **{"bfio-h0": 40.0, "br0": 50.0,
                                                    "brh-survival": 52.0, "brh-oracle": 55.0})
    rows += _rows(b, jsq=100.0, least_load=30.0, **{"bfio-h0": 60.0, "br0": 50.0,
                                                     "brh-survival": 45.0, "brh-oracle": 40.0})
    rows[-1]["throughput_loaded_tok_s"] = 1.0  # cell b: throughput no longer ranks like imbalance
    bad = rule_violations(rows)
    keys = {name: [k[-1] for k, _ in cells] for name, cells in bad.items()}
    assert keys["oracle<=br0"] == ["saturated"]           # 55 > 50
    assert keys["survival<=1.02br0"] == ["saturated"]     # 52 > 51
    assert keys["best_br<=bfio-h0"] == ["saturated"]      # 50 > 40
    assert keys["best_br<=baselines"] == ["0.5"]          # 45 > least_load 30 (keys are str)
    assert keys["throughput_ranks_like_imbalance"] == ["0.5"]
    table = matrix_lines(rows)
    assert len(table) == 2 + 2 and "open loop 0.5× capacity" in "".join(table)


def test_context_splits_the_throughput_rule_and_names_bfio_lease_misses():
    a = dict(workload="w", replicas=8, requests=3000, seed=0, load="saturated")
    b = {**a, "load": 0.5}
    rows = (_rows(a, br0=50.0, **{"bfio-h0": 40.0, "bfio-h0-lease": 55.0})
            + _rows(b, br0=50.0, **{"bfio-h0": 60.0, "bfio-h0-lease": 45.0}))
    rows[1]["kv_lease_missed"] = 0.025  # bfio-h0 beats br0 in cell a with 2.5 % past the lease
    rows[0]["kv_lease_missed"] = 0.0
    rows[4]["kv_lease_missed"] = 0.0
    rows[3]["throughput_loaded_tok_s"] = 1.0  # open loop: br0 ranked last by throughput
    lines = context_lines(rows)
    assert lines[0].startswith("- Throughput order, saturated cells: 0 of 1 break it; 100.0% of")
    # cell b: of its 3 pairs only (br0, bfio-h0) is ordered unlike imbalance
    assert lines[1].startswith("- Throughput order, open loop cells: 1 of 1 break it; 66.7% of")
    assert lines[2].endswith("25 s pool deadline and first-token guard): 1 of 2 cells break it")  # cell b: 50 > 45
    assert "Of the 1 cells where bfio-h0 beats the best BR row, in 1 it keeps" in lines[3]
    assert "(2.5 % of them; br0 0 % in the same cells)" in lines[3]
    assert "bfio-h0 past lease" in matrix_lines(rows)[0] and "2.5 %" in "".join(matrix_lines(rows))


def test_seed_lines_give_each_ratio_over_the_seeds():
    a = dict(workload="w", replicas=8, requests=3000, seed=0, load="saturated")
    rows = _rows(a, br0=50.0, **{"brh-oracle": 25.0}) + _rows({**a, "seed": 1}, br0=40.0, **{"brh-oracle": 80.0})
    rows += _rows({**a, "workload": "alone"}, br0=1.0, **{"brh-oracle": 1.0})  # one seed: no line
    lines = [line for line in context_lines(rows) if line.startswith("| w G=8")]
    # oracle ÷ br0 = 0.5 and 2.0: geometric mean 1.00, range 0.50–2.00
    assert lines == ["| w G=8 n=3,000 saturated, 2 seeds | 1.00 (0.50–2.00) |"]


def test_noise_floor_counts_only_breaks_beyond_the_twins():
    a = dict(workload="w", replicas=8, requests=3000, seed=0, load="saturated")
    b = {**a, "seed": 1}
    rows = _rows(a, br0=100.0, **{"brh-oracle": 105.0, "bfio-h0": 80.0})   # twins ±10 %
    rows += _rows({**a, "twin": "knob"}, br0=90.0) + _rows({**a, "twin": "drop"}, br0=110.0)
    rows += _rows(b, br0=100.0, **{"brh-oracle": 130.0, "bfio-h0": 95.0})  # twins ±1 %
    rows += _rows({**b, "twin": "knob"}, br0=99.0) + _rows({**b, "twin": "drop"}, br0=101.0)
    floors = noise_floors(rows)
    assert floors[("w", 8, 3000, 0, "saturated")] == pytest.approx(math.log(1 / 0.9))
    assert floors[("w", 8, 3000, 1, "saturated")] == pytest.approx(math.log(1 / 0.99))
    # twins are not rows of the matrix: they join no rule and no table
    assert len(rule_violations(rows)["oracle<=br0"]) == 2 and len(matrix_lines(rows)) == 2 + 2
    lines = floor_lines(rows)
    assert "2 cells): the farther twin lands a median 6.1 %, at most 11.1 %, from br0" in lines[0]
    # oracle: 1.05 is inside cell a's 11 % floor, 1.30 beyond cell b's 1 %; bfio-h0: 100/80 =
    # 1.25 beyond 11 %, 100/95 = 1.053 beyond 1 %
    assert lines[1].endswith("brh-oracle ≤ br0: 1 of its 2 breaks")
    assert lines[3].endswith("≤ bfio-h0: 2 of its 2 breaks")
    # _rows gives throughput 1e6 / imbalance: every pair ordered alike, no break
    assert "imbalance does: 0 of its 0 breaks" in lines[5]
    # floors: a ±10.5 % (imbalance) and 10.5 % (throughput, from the twins' 1e6 / imbalance); b 1 %
    rows[1]["throughput_loaded_tok_s"] = 20_000.0  # a: oracle (105) out-runs bfio-h0 (80, 12,500)
    rows[6]["throughput_loaded_tok_s"] = 10_050.0  # b: oracle (130) 0.5 % over br0's (100, 10,000)
    lines = floor_lines(rows)
    # a: oracle vs bfio-h0 is discordant by ln(105/80) and ln(1.6), both over 10.5 % (oracle vs br0,
    # 5 % in imbalance, is not); b: oracle vs br0's 0.5 % throughput gap is inside b's 1 %
    assert "imbalance does: 1 of its 2 breaks" in lines[5]
    assert floor_lines(_rows(a, br0=1.0)) == []


def test_declared_grids_have_the_issue_shapes():
    full = declare_quality("full", QUALITY_POLICIES)
    saturated = {(c.workload, c.replicas, c.requests, c.seed) for c in full["quality"]
                 if c.option("load") == "saturated"}
    opened = {(c.workload, c.replicas, c.option("load")) for c in full["quality"]
              if c.option("load") != "saturated"}
    # 2 generated workloads × 2 G × 2 sizes × 5 seeds + 2 replays × 2 G × 2 sizes = 48
    assert len(saturated) == 48
    assert len(opened) == 6 * 2 * 4
    assert {c.option("load") for c in full["ttft_open_loop"]} == {0.7, 0.9, 1.0}
    twins = [c for c in full["quality"] if c.option("twin") is not None]
    assert {c.policy for c in twins} == {"br0"} and len(twins) == 2 * (48 + 48)
    quick = declare_quality("quick", ["jsq", "br0"])
    assert {c.policy for c in quick["quality"]} == {"jsq", "br0"}
    with pytest.raises(ValueError, match="profile"):
        declare_quality("huge", QUALITY_POLICIES)


def test_one_saturated_and_one_open_loop_cell():
    base = dict(experiment="quality", kind="quality", workload="azure-conv-2023", replicas=4,
                slots=8, requests=600, seed=0)
    sat = run_quality_cell(Cell(policy="br0", options=(("load", "saturated"),), **base))[0]
    assert sat["mean_imbalance"] > 0 and sat["throughput_loaded_tok_s"] > 0
    knob = run_quality_cell(Cell(policy="br0", options=(("load", "saturated"), ("ttft_slo_s", "off")),
                                 **base))[0]
    assert knob["ttft_s_p99"] >= sat["ttft_s_p99"]  # the urgency term shortens the tail
    for twin in ("knob", "drop"):
        row = run_quality_cell(Cell(policy="br0", options=(("load", "saturated"), ("twin", twin)), **base))[0]
        assert row["mean_imbalance"] > 0 and row["throughput_loaded_tok_s"] > 0
    with pytest.raises(ValueError, match="twin 'x'"):
        run_quality_cell(Cell(policy="br0", options=(("load", "saturated"), ("twin", "x")), **base))
    opened = run_quality_cell(Cell(policy="jsq", options=(("load", 0.5),), **base))[0]
    cap = saturated_capacity("azure-conv-2023", 600, 0, 4, 8)
    assert opened["capacity_rps"] == cap
    assert math.isclose(opened["rate_scale"], 0.5 * cap / opened["native_rps"])


def test_the_command_prints_the_matrix_the_rules_and_progress(monkeypatch, capsys):
    import balanceroute.analysis.quality_cli as quality  # the command binds declare_quality
    from balanceroute.cli import main

    base = dict(experiment="quality", kind="quality", workload="azure-conv-2023", replicas=4,
                slots=8, requests=400, seed=0, options=(("load", "saturated"),))
    monkeypatch.setattr(quality, "declare_quality", lambda profile, names, **_: {
        "quality": [Cell(policy=p, **base) for p in names]})
    assert main(["quality", "--policies", "jsq,br0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("| cell | jsq | br0 |") and "azure-conv-2023 G=4 n=400 seed=0 saturated" in out
    assert "brh-oracle ≤ br0: **0 of 1 cells break it**" in out
    assert "quality: 2/2 cells (100 %)" in err  # the log line of a non-terminal run
    assert main(["quality", "--policies", "jsq", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_paper_lines_put_the_headline_cells_next_to_table_1():
    # servegen-r1 stands in for the paper's proprietary set; only its largest G = 8 saturated
    # request count is shown, ÷ br0 as the geometric mean over the seeds with its range
    head = dict(workload="servegen-r1", replicas=8, requests=20000, load="saturated")
    rows = (_rows({**head, "seed": 0}, br0=100.0, jsq=400.0, **{"brh-oracle": 25.0})
            + _rows({**head, "seed": 1}, br0=200.0, jsq=400.0, **{"brh-oracle": 200.0})
            + _rows({**head, "requests": 3000, "seed": 0}, br0=1.0, **{"brh-oracle": 9.0})
            + _rows({**head, "replicas": 16, "seed": 0}, br0=1.0, **{"brh-oracle": 9.0})
            + _rows({**head, "load": 0.5, "seed": 0}, br0=1.0, **{"brh-oracle": 9.0}))
    lines = paper_lines(rows)
    assert len(lines) == 2 + 3  # header, rule, then jsq, br0, brh-oracle (no azure-2024-long rows)
    jsq, br0, oracle = lines[2:]
    assert jsq == "| proprietary → servegen-r1, n=20,000, 2 seeds | jsq | 215,110 | 4.14 | 400 | 2.83 (2.00–4.00) |"
    assert br0 == "|  | br0 | 51,927 | 1.00 | 150 | 1.00 (1.00–1.00) |"
    # √(0.25 × 1.0) = 0.5; the paper's 23,577 ÷ 51,927 = 0.45
    assert oracle == "|  | brh-oracle | 23,577 | 0.45 | 112 | 0.50 (0.25–1.00) |"
    assert paper_lines(_rows({**head, "workload": "mooncake-conv", "seed": 0}, br0=1.0)) == []


# ------------------------------------------------------------------ the rules over held-out seeds


@pytest.mark.parametrize(("df", "exact"), [(5, 2.570582), (9, 2.262157), (19, 2.093024),
                                           (29, 2.045230), (100, 1.983972)])
def test_t_quantile_matches_the_table(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, abs=3e-4 if df < 9 else 1e-4)


def test_paired_interval_is_the_t_interval_of_the_log_ratios():
    # five ratios e^0.1 and five e^-0.1: mean 0, sd 0.1·√(10/9), se 0.1/3, t_0.975(9) = 2.262157
    gm, lo, hi = paired_interval([math.exp(0.1), math.exp(-0.1)] * 5)
    assert gm == pytest.approx(1.0)
    assert (lo, hi) == pytest.approx((math.exp(-2.262157 * 0.1 / 3), math.exp(2.262157 * 0.1 / 3)),
                                     rel=1e-4)
    assert paired_interval([1.1] * 4) == pytest.approx((1.1, 1.1, 1.1))  # no spread: a point
    one = paired_interval([0.7])
    assert one[0] == pytest.approx(0.7) and math.isnan(one[1]) and math.isnan(one[2])
    with pytest.raises(ValueError, match="positive ratio"):
        paired_interval([1.0, 0.0])
    assert [verdict(0.8, 1.0), verdict(1.01, 1.2), verdict(0.9, 1.1)] == ["holds", "breaks", "undecided"]
    assert verdict(math.nan, math.nan) == "undecided"


def test_powered_lines_judge_each_rule_per_group_of_seeds():
    spread = [1.0, 1.1, 0.9, 1.05, 0.95]  # seed-to-seed noise shared by every row of a seed
    rows = []
    for s, f in enumerate(spread):
        a = dict(workload="w", replicas=8, requests=3000, seed=100 + s, load="saturated")
        b = {**a, "load": 0.5}
        # a: oracle always half of br0 (holds), survival 1.02·br0 × 1.03 or 0.99 (undecided; above
        # br0, so br0 is the best BR row), bfio-h0 always 10 % under br0 (breaks), least_load
        # twice br0 (holds)
        rows += _rows(a, least_load=200 * f, jsq=300 * f, **{
            "bfio-h0": 90 * f, "bfio-h0-lease": 100 * f, "br0": 100 * f,
            "brh-survival": 102 * f * (1.03 if s % 2 else 0.99), "brh-oracle": 50 * f})
        # b: br0 has less imbalance than least_load and, every seed, less throughput too
        rows += _rows(b, least_load=200 * f, br0=100 * f)
        rows[-1]["throughput_loaded_tok_s"] = rows[-2]["throughput_loaded_tok_s"] * 0.9
    lines = powered_lines(rows)
    table = [line for line in lines if line.startswith("| w ")]
    assert table[0].startswith("| w G=8 n=3,000 0.5× | 5 |")
    assert table[1].startswith("| w G=8 n=3,000 saturated | 5 | 0.500 (0.500–0.500) holds | ")
    assert "undecided | 1.111 (1.111–1.111) breaks | 0.500 (0.500–0.500) holds | " \
           "1.000 (1.000–1.000) holds" in table[1]
    assert table[0].endswith("| 0 / 1 of 1 |")  # the one decided pair, the wrong way round
    assert "- brh-oracle ≤ br0: holds in 1, undecided in 0, breaks in 0 of 1 groups" in lines
    assert "- min(br0, brh-survival) ≤ bfio-h0: holds in 0, undecided in 0, breaks in 1 of 1 " \
           "groups" in lines
    assert "  - breaks: w G=8 n=3,000 saturated: 1.111 (1.111–1.111)" in lines
    assert "  - breaks: w G=8 n=3,000 0.5×: 1 of 1 decided pairs opposite" in lines
    # one seed per group decides nothing: no lines at all
    assert powered_lines([r for r in rows if r["seed"] == 100]) == []
    # rows not run (--policies br0,bfio-h0): their rules get a dash and no tally line
    some = powered_lines([r for r in rows if r["policy"] in ("br0", "bfio-h0")])
    assert not any(line.startswith("- brh-oracle") for line in some)
    assert "| — | — | 1.111 (1.111–1.111) breaks | — | — |" in "".join(some)


def test_no_bfio_point_may_dominate_the_br_point():
    """Worked example on the imbalance–TTFT P99 plane, two draws: in group a bfio-h0 has 10 % less
    imbalance but twice BR-0's TTFT P99 (BR-0 is not dominated: min ratio 0.5, holds); in b it is
    better on both axes (0.9× BR-0's imbalance and TTFT: min ratio 1.11, breaks)."""
    rows = []
    for s, f in enumerate([1.0, 1.2]):
        for group, ttft in (("a", 2.0), ("b", 0.9)):
            cell = dict(workload=group, replicas=8, requests=3000, seed=1000 + s, load="saturated")
            rows += [{**r, "ttft_s_p99": {"br0": 1.0 * f, "bfio-h0": ttft * f}[r["policy"]]}
                     for r in _rows(cell, br0=100 * f, **{"bfio-h0": 90 * f})]
    lines = powered_lines(rows)
    assert any(line.startswith("| a G=8") and "| 0.500 (0.500–0.500) holds |" in line for line in lines)
    assert any(line.startswith("| b G=8") and "| 1.111 (1.111–1.111) breaks |" in line for line in lines)
    assert ("- no bfio-h0 point dominates the BR point (imbalance–TTFT P99 plane): holds in 1, "
            "undecided in 0, breaks in 1 of 2 groups") in lines


def test_the_forest_plot_draws_every_group(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra draws the figure")
    from balanceroute.analysis.figures import fig_quality_seeds as draw_powered

    rows = []
    for s, f in enumerate([1.0, 1.1, 0.9]):
        for load in ("saturated", 0.5):
            rows += _rows(dict(workload="w", replicas=8, requests=3000, seed=s, load=load),
                          least_load=200 * f, **{"br0": 100 * f, "brh-oracle": 60 * f})
    path = draw_powered(rows, tmp_path / "seeds.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert draw_powered(rows[:3], tmp_path / "none.png") is None  # one seed: nothing to draw


def test_held_out_seeds_are_drawn_by_nothing_else():
    for profile in ("quick", "full"):
        grids = declare_quality(profile, QUALITY_POLICIES)
        cells = grids["quality_seeds"]
        assert {c.seed for c in cells} == set(HELD_OUT_SEEDS[profile])
        assert min(HELD_OUT_SEEDS[profile]) >= 1000  # training draws stay below 1,000
        others = {c.seed for name, g in grids.items() if name != "quality_seeds" for c in g}
        assert others.isdisjoint(HELD_OUT_SEEDS[profile])
        # a generated workload draws anew per seed; a replay is thinned per seed
        assert all((c.option("thin") is None) == (c.workload in GENERATED) for c in cells)
        assert {c.option("thin") for c in cells} <= {None, REPLAY_THIN}
        assert {c.policy for c in cells} == set(QUALITY_POLICIES)
    full = declare_quality("full", QUALITY_POLICIES)
    matrix = {(c.workload, c.replicas, c.requests, c.option("load")) for c in full["quality"]}
    groups = {(c.workload, c.replicas, c.requests, c.option("load")) for c in full["quality_seeds"]}
    bundle = {g for g in groups if g[0] not in SHAPE_GROUPS}
    assert bundle == matrix  # every cell shape of the matrix, as a group of 20 draws
    # plus the parametric shapes: 8 saturated × G 8, 16; 2 open-loop × G × 4 loads
    assert len(groups - bundle) == 16 + 16 and len(bundle) == 16 + 48
    assert len(full["quality_seeds"]) == len(groups) * 20 * len(QUALITY_POLICIES)


def test_training_draws_and_group_filters_choose_the_cells():
    names = ["jsq", "br0"]
    train = declare_quality("full", names, draws="training", groups="shapes", max_draws=3)
    cells = train["quality_seeds"]
    assert {c.seed for c in cells} == {100, 101, 102} and {c.workload for c in cells} <= set(SHAPE_GROUPS)
    assert set(TRAINING_SEEDS["full"]).isdisjoint(HELD_OUT_SEEDS["full"])
    bundle = declare_quality("quick", names, groups="bundle")["quality_seeds"]
    assert not {c.workload for c in bundle} & set(SHAPE_GROUPS)
    with pytest.raises(ValueError, match="draws"):
        declare_quality("quick", names, draws="test")


def test_a_deadline_factor_reaches_the_br_rows_of_every_grid():
    from balanceroute.analysis.quality import _load
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate

    grids = declare_quality("quick", ["jsq", "br0"], deadline_factor=1.0)
    assert all(c.option("deadline_factor", None) == 1.0 for cells in grids.values() for c in cells)
    base = dict(experiment="quality_seeds", kind="quality", workload="shape-correlated", replicas=4,
                slots=8, requests=600, seed=100)
    opt = (("load", "saturated"), ("deadline_factor", 1.0))
    row = run_quality_cell(Cell(policy="br0", options=opt, **base))[0]
    _, test = _load("shape-correlated", 600, 100)
    want = simulate(test, get_policy("br0", deadline_factor=1.0),
                    SimConfig(num_replicas=4, slots=8, check_assignments=False)).metrics
    shipped = run_quality_cell(Cell(policy="br0", options=opt[:1], **base))[0]
    assert row["mean_imbalance"] == want["mean_imbalance"] != shipped["mean_imbalance"]
    jsq = [run_quality_cell(Cell(policy="jsq", options=o, **base))[0] for o in (opt, opt[:1])]
    assert jsq[0] == jsq[1]  # a row without the parameter runs as it is


def test_a_thinned_replay_is_a_new_draw_of_the_same_trace():
    from balanceroute.analysis.quality import _load

    whole = _load("azure-conv-2023", 2000, 0)
    a, b = _load("azure-conv-2023", 2000, 1000, REPLAY_THIN), _load("azure-conv-2023", 2000, 1001, REPLAY_THIN)
    n = len(whole[0]) + len(whole[1])
    for train, test in (a, b):
        assert 0.85 * n < len(train) + len(test) < 0.95 * n and abs(len(train) - len(test)) <= 1
        assert np.all(np.diff(test.arrival_s) >= 0)  # order and arrival times kept
    assert not np.array_equal(a[1].prompt_len[:50], b[1].prompt_len[:50])  # two draws differ
    assert _load("azure-conv-2023", 2000, 1000, REPLAY_THIN)[1] is a[1]  # cached, same draw
    base = dict(experiment="quality_seeds", kind="quality", workload="azure-conv-2023",
                policy="br0", replicas=4, slots=8, requests=600, seed=1000)
    thinned = run_quality_cell(Cell(options=(("load", 0.5), ("thin", REPLAY_THIN)), **base))[0]
    plain = run_quality_cell(Cell(options=(("load", 0.5),), **base))[0]
    assert thinned["capacity_rps"] != plain["capacity_rps"]  # the capacity of the thinned draw


def _lookahead_rows(group: str, replicas: int, load: str, imb: dict[str, list[float]]) -> list[dict]:
    return [{"workload": group, "replicas": replicas, "requests": 3000, "seed": 1000 + s, "load": load,
             "policy": policy, "mean_imbalance": values[s]}
            for policy, values in imb.items() for s in range(len(values))]


def test_ttft_lines_count_the_groups_where_the_first_token_bound_holds():
    """Worked example: TTFT P99 of br0 / brh-survival / jsq per draw. Group a: 1.2× JSQ's on
    both draws (holds: ratio 0.8 to the bound); b: the larger row 1.8× (breaks: 1.2); c: 1.2× and
    1.8× (undecided); a group with one draw is left out."""
    def rows(group, load, br0, surv, jsq):
        return [{"workload": group, "replicas": 8, "requests": 3000, "seed": 1000 + s, "load": load,
                 "policy": p, "mean_imbalance": 1.0, "ttft_s_p99": v[s]}
                for p, v in (("br0", br0), ("brh-survival", surv), ("jsq", jsq))
                for s in range(len(v))]
    data = (rows("a", "saturated", [1.2, 2.4], [1.0, 2.4], [1.0, 2.0])
            + rows("b", "0.8", [1.8, 1.8], [1.0, 3.6], [1.0, 2.0])
            + rows("c", "saturated", [1.2, 3.6], [1.2, 3.6], [1.0, 2.0])
            + rows("d", "saturated", [9.0], [9.0], [1.0]))
    (text,) = ttft_lines(data)
    assert "Over held-out draws 1000–1001 (3 groups, 2 saturated and 1 open loop)" in text
    assert "in 1 of 3 groups; undecided in 1, above it in 1;" in text
    assert "the highest is b G=8 n=3,000 0.8×: 1.80× (1.80–1.80)." in text
    assert "Not holding as well: c G=8 n=3,000 saturated: 1.47×" in text and " d G" not in text


def test_lookahead_lines_name_where_the_deployable_lookahead_does_not_pay():
    """Worked example: in group a the clairvoyant row gains 40 % and the survival row 5 % (does
    not pay); in group b survival gains 20 % where the oracle gains 50 % (pays); c is flat; the
    open-loop group d and a group with one draw are left out."""
    rows = (_lookahead_rows("a", 8, "saturated", {"br0": [100, 100], "brh-survival": [95, 95],
                                                    "brh-oracle": [60, 60]})
            + _lookahead_rows("b", 8, "saturated", {"br0": [100, 100], "brh-survival": [80, 80],
                                                    "brh-oracle": [50, 50]})
            + _lookahead_rows("c", 16, "saturated", {"br0": [100, 100], "brh-survival": [101, 99],
                                                     "brh-oracle": [100, 100]})
            + _lookahead_rows("d", 8, "0.8", {"br0": [100, 100], "brh-survival": [50, 50],
                                              "brh-oracle": [10, 10]})
            + _lookahead_rows("e", 8, "saturated", {"br0": [100], "brh-survival": [50],
                                                    "brh-oracle": [10]}))
    (text,) = lookahead_lines(rows)
    assert "(3 saturated groups, G = 8 and 16, 3,000 requests)" in text
    assert "within 2 % of BR-0's mean imbalance (geometric mean over the draws) in 1 of 3 groups" in text
    assert "it gains more in a G = 8, 3,000 requests (0.950×); b G = 8, 3,000 requests (0.800×)." in text
    assert ("gains ≥ 30 % in a G = 8, 3,000 requests (0.600×, survival 0.950×); "
            "b G = 8, 3,000 requests (0.500×, survival 0.800×).") in text
    assert "gains less than 10 % in a G = 8, 3,000 requests:" in text
    assert " d G" not in text and " e G" not in text
