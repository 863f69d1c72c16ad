"""The replicas experiments: declared grids, scenarios and the judged lines."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.analysis.quality import HELD_OUT_SEEDS
from balanceroute.analysis.replicas import declare_replicas, replicas_lines, speed_models


def test_grids_use_held_out_draws_only():
    for profile in ("quick", "full"):
        grids = declare_replicas(profile, ["jsq", "least_load", "br0", "brh-survival", "random",
                                           "round_robin", "power_of_two"])
        seeds = {c.seed for cells in grids.values() for c in cells}
        assert seeds <= set(HELD_OUT_SEEDS[profile])
    quick = declare_replicas("quick", ["least_load", "br0"])
    assert sum(len(v) for v in quick.values()) <= 10  # quick mode stays small


def test_speed_scenarios():
    two = speed_models("two-slow", 0)
    assert [m.a / two[0].a for m in two] == [1.0] * 6 + [1.5, 1.5]
    spread = np.array([m.b for m in speed_models("spread", 3)]) / 0.03
    assert spread.min() >= 0.7 and spread.max() <= 1.3 and np.ptp(spread) > 0
    assert [m.b for m in speed_models("spread", 3)] == [m.b for m in speed_models("spread", 3)]
    with pytest.raises(ValueError, match="scenario"):
        speed_models("fast", 0)


def _row(exp, policy, seed, **metrics):
    base = dict(experiment=exp, workload="w", seed=seed, policy=policy, preemptions=0.0,
                recomputed_tokens=0.0, mean_imbalance=1.0, step_idle_fraction=0.0,
                mean_step_idle_ms=0.0, throughput_loaded_tok_s=1.0, ttft_s_p50=0.0,
                ttft_s_p99=0.0, kv_lease_failed=0.0, kv_lease_reprefilled=0.0,
                replica_wait_mean_steps=0.0)
    return {**base, **metrics}


def test_lines_judge_the_rules_on_known_ratios():
    rows = []
    for seed, (br, base) in enumerate([(40.0, 100.0), (41.0, 100.0), (39.0, 100.0)]):
        rows += [_row("replicas_budget", "least_load", seed, budget=0.8, mean_imbalance=base,
                      preemptions=5.0),
                 _row("replicas_budget", "br0", seed, budget=0.8, mean_imbalance=br)]
    for seed, (br, tok, base) in enumerate([(120.0, 100.0, 90.0), (121.0, 100.0, 95.0)]):
        rows += [_row("replicas_speed", "br0", seed, speed="two-slow", throughput_loaded_tok_s=br),
                 _row("replicas_speed", "br0-tokens", seed, speed="two-slow",
                      throughput_loaded_tok_s=tok),
                 _row("replicas_speed", "jsq", seed, speed="two-slow",
                      throughput_loaded_tok_s=base)]
    text = "\n".join(replicas_lines(rows))
    assert "br0 imbalance / best baseline's 0.400 (" in text and "holds (rule ≤ 0.5)" in text
    assert "preemptions 0 over 3 draws (3 draws with none; fewest of a baseline: 15)" in text
    assert "br0-tokens / br0 throughput 0.830 (0.792–0.870) holds" in text
