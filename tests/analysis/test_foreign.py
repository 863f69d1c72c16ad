"""The foreign-traffic experiment's wrapper (analysis/foreign.py): with nothing foreign it is
the policy itself, decision for decision; its views differ only where the router lacks
knowledge."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.analysis.foreign import (
    PROFILES,
    ForeignScenario,
    ForeignTraffic,
    foreign_lines,
    run_foreign_cell,
    scenario,
)
from balanceroute.core.policies import get_policy
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads import load_workload


@pytest.fixture(scope="module")
def workload():
    return load_workload("servegen-r1", requests=300, seed=1000)


@pytest.mark.parametrize("view", ["full", "reconciled"])
def test_one_router_alone_is_the_policy(workload, view: str) -> None:
    config = SimConfig(num_replicas=4, slots=8)
    plain = simulate(workload, get_policy("br0"), config, engine="generic")
    owner = np.zeros(len(workload), dtype=np.int64)
    wrapped = simulate(workload, ForeignTraffic([get_policy("br0")], owner, ForeignScenario(view=view),
                                                np.random.default_rng(0)), config, engine="generic")
    assert np.array_equal(plain.replica, wrapped.replica)
    assert plain.metrics["mean_imbalance"] == wrapped.metrics["mean_imbalance"]


def test_views_differ_only_without_knowledge(workload) -> None:
    kw = dict(replicas=4, slots=8, seed=3)
    full = run_foreign_cell(workload, "br0", scenario("restart", "full"), **kw)
    rec = run_foreign_cell(workload, "br0", scenario("restart", "reconciled", poll_s=1e-9), **kw)
    ledger = run_foreign_cell(workload, "br0", scenario("restart", "ledger"), **kw)
    # a report every tick is full knowledge; the lost ledger is not
    assert rec["mean_imbalance"] == pytest.approx(full["mean_imbalance"])
    assert ledger["mean_imbalance"] != full["mean_imbalance"]
    assert np.isfinite(full["window_imbalance"])


def test_foreign_placements_respect_slots(workload) -> None:
    owner = np.where(np.random.default_rng(0).random(len(workload)) < 0.3, -1, 0)
    policy = ForeignTraffic([get_policy("least_load")], owner, ForeignScenario(foreign=0.3, view="reports"),
                            np.random.default_rng(1))
    simulate(workload, policy, SimConfig(num_replicas=4, slots=8, check_assignments=True), engine="generic")


def test_lines_judge_the_acceptance() -> None:
    base = (("br0", "full", 100.0), ("br0", "reconciled", 110.0), ("least_load", "reports", 200.0))
    rows = [{"scenario": "foreign30", "policy": p, "view": v, "seed": seed, "mean_imbalance": x * (1 + seed / 100)}
            for seed in range(4) for p, v, x in base]
    text = "\n".join(foreign_lines(rows))
    assert "| br0 reconciled | 1.10 (1.10–1.10) |" in text
    assert "BR reconciled ÷ BR full = 1.10" in text and "acceptance ≤ 1.2: holds" in text
    assert "least-load on the reports = 0.55" in text and "acceptance < 1: holds" in text
    worse = [{**r, "mean_imbalance": r["mean_imbalance"] * 1.2} if r["view"] == "reconciled" else r for r in rows]
    assert "acceptance ≤ 1.2: fails" in "\n".join(foreign_lines(worse))


def test_quick_profile_is_small() -> None:
    p = PROFILES["quick"]
    assert len(p["seeds"]) * p["requests"] * len(p["rows"]) * 4 <= 40_000  # about 20 s on 2 cores
